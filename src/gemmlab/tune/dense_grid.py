"""The dense sweep's grid and candidates, as data (``tune.dense`` sweeps them; ``tune.dense_rules`` reads
``AXES``, ``CANDIDATES`` and ``SPLIT_PATHS``).

    grid(name) -> [GridPoint]   per class (gemv, small, large) the product of ``AXES``, plus the points off it
                                (``EXTRA``: the other layout and dtype, odd and padded shapes); "quick", "cpu": fewer
    CANDIDATES[class]           per class the candidates (``C``: a name, the path it pins, the staging pin and the
                                GemmConfig fields it sets; ``T``: the tile fields)
"""

from __future__ import annotations

from dataclasses import dataclass

from gemmlab.problems import Case


@dataclass(frozen=True)
class GridPoint:
    """A case of the sweep and the class whose candidates it times."""

    cls: str
    case: Case

    @property
    def spec(self) -> str:
        return self.case.label


AXES = {  # class -> (M values, N values, K values): the product is the class's grid (bf16, nn.Linear layout)
    "gemv": ((1, 4, 16), (576, 4096, 14336, 57344), (1536, 4096, 14336)),
    "small": ((32, 64, 128, 256), (576, 4096, 14336), (1536, 4096, 14336)),
    "large": ((512, 1024, 2048, 4096, 8192), (576, 4096, 14336), (1536, 4096, 14336)),
}


def _p(cls: str, m: int, n: int, k: int, dtype: str = "bfloat16", layout: str = "linear", pad: int = 0) -> GridPoint:
    return GridPoint(cls, Case(m, n, k, dtype, layout, pad))


EXTRA = [  # off the product: the other layout and dtype, the shapes issue 23 names, operands TMA cannot describe
    _p("gemv", 1, 6144, 4096, "float16"),
    _p("gemv", 16, 28672, 4096, "float16"),
    _p("gemv", 1, 4096, 4096, "float16", "row"),
    _p("gemv", 16, 4096, 14336, "bfloat16", "row"),
    _p("small", 64, 4096, 4096, "float16", "row"),
    _p("small", 256, 4096, 4096, "float16", "row"),
    _p("large", 3000, 5000, 7000, "float16", "row"),
    _p("large", 2048, 5120, 5120),
    _p("large", 2048, 5120, 8192),
    _p("large", 2048, 576, 7168, "float16"),
    _p("large", 4096, 28672, 4096, "float16", "row"),
    _p("large", 16384, 6144, 4096),
    _p("odd", 1, 4093, 4099, "float16"),
    _p("odd", 1, 14336, 4097),
    _p("odd", 4, 4096, 4095),
    _p("odd", 16, 12289, 1021),
    _p("odd", 64, 14336, 4097, "float16"),
    _p("odd", 127, 4099, 8191, "bfloat16", "row"),
    _p("odd", 777, 3333, 1024, "float16", "row"),
    _p("odd", 2048, 6144, 4096, pad=3),
    _p("odd", 8191, 8193, 4097, "float16", "row"),
]


QUICK = [
    _p("gemv", 1, 4096, 4096),
    _p("small", 64, 4096, 4096),
    _p("large", 2048, 5120, 5120),
    _p("odd", 1, 4093, 4099, "float16"),
    _p("odd", 777, 3333, 1024, "float16", "row"),
]


CPU = [
    _p("gemv", 1, 40, 72),
    _p("odd", 4, 37, 71),
    _p("small", 40, 64, 96),
    _p("large", 300, 72, 64),
    _p("odd", 37, 53, 71, "float16", "row"),
]


GRIDS = ("full", "quick", "cpu", "dense-suite")


def grid(name: str = "full") -> list[GridPoint]:
    """The sweep's points: "full" (the class products and EXTRA), "quick" (five, a plumbing check), "cpu"
    (interpreter sizes), "dense-suite" (``problems.DENSE``'s cases with gemmlab's choice only: what ``bench gemm
    --suite dense`` runs, for compiling its kernels in parallel first)."""
    if name not in GRIDS:
        raise ValueError(f"grid {name!r}: one of {', '.join(GRIDS)}")
    if name == "quick":
        return QUICK
    if name == "cpu":
        return CPU
    if name == "dense-suite":
        from gemmlab.problems import DENSE

        return [GridPoint("suite", c) for c in DENSE]
    product = [_p(cls, m, n, k) for cls, (ms, ns, ks) in AXES.items() for m in ms for n in ns for k in ks]
    odd = [p for p in EXTRA if p.cls == "odd"]  # rules come from these; the rest of EXTRA only checks them, last
    return product + odd + [p for p in EXTRA if p.cls != "odd"]


def C(name: str, path: str | None = None, stage: bool | None = None, **fields) -> dict:
    """A candidate: its name, the path it pins (None: the plan's own), the staging pin (None: the rule) and the
    GemmConfig fields it sets over the table's config of that path."""
    return {"name": name, "path": path, "stage": stage, "fields": fields}


def T(bm: int, bn: int, bk: int, w: int, s: int, **more) -> dict:
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, **more)


GEMV = [  # M <= 16: the GEMV kernel (FFMA for one-row tiles, HMMA for 16-row tiles) against split-K over TMA
    C("gemv fma 1x32x128 w4", "gemv", **T(1, 32, 128, 4, 1, split_k=0)),
    C("gemv fma 1x32x256 w8", "gemv", **T(1, 32, 256, 8, 1, split_k=0)),
    C("gemv fma 1x16x512 w4", "gemv", **T(1, 16, 512, 4, 1, split_k=0)),
    C("gemv dot 16x32x128 w4 s3", "gemv", **T(16, 32, 128, 4, 3, split_k=0)),
    C("gemv dot 16x64x128 w4 s3", "gemv", **T(16, 64, 128, 4, 3, split_k=0)),
    C("splitk 16x64x128 s6", "tma_splitk", **T(16, 64, 128, 4, 6, split_k=0)),
    C("splitk 16x32x128 s4", "tma_splitk", **T(16, 32, 128, 4, 4, split_k=0)),
    C("splitk 16x128x128 s4", "tma_splitk", **T(16, 128, 128, 4, 4, split_k=0)),
]


SMALL = [  # 16 < M <= 256: split-K tiles, and persistent tiles whose partial last wave is split
    C("splitk 64x64x128 s5", "tma_splitk", **T(64, 64, 128, 4, 5, split_k=0)),
    C("splitk 64x32x256 s4", "tma_splitk", **T(64, 32, 256, 4, 4, split_k=0)),
    C("splitk 64x128x64 s6", "tma_splitk", **T(64, 128, 64, 4, 6, split_k=0)),
    C("splitk 128x128x64 w8 s4", "tma_splitk", **T(128, 128, 64, 8, 4, split_k=0)),
    C("persistent 64x128x64 w4 s4 tail8", "tma_persistent", **T(64, 128, 64, 4, 4, tail_split=8)),
    C("persistent 128x128x64 w8 s4 tail8", "tma_persistent", **T(128, 128, 64, 8, 4, tail_split=8)),
    C(
        "persistent 128x256x64 w8 s3 sub tail8",
        "tma_persistent",
        **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8),
    ),
]


LARGE = [  # persistent tiles; the split tail first, so a tail that does not split is timed under its name
    C("128x256x64 w8 s3 sub tail8", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
    C("128x256x64 w8 s3 sub", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True)),
    C("128x128x64 w8 s4 tail8", "tma_persistent", **T(128, 128, 64, 8, 4, tail_split=8)),
    C("256x128x64 w8 s3 sub tail8", "tma_persistent", **T(256, 128, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
    C("128x64x64 w4 s4 tail8", "tma_persistent", **T(128, 64, 64, 4, 4, tail_split=8)),
    C("128x256x64 w8 s4 sub tail8", "tma_persistent", **T(128, 256, 64, 8, 4, epilogue_subtile=True, tail_split=8)),
    C(
        "128x256x64 w8 s3 sub g16 tail8",
        "tma_persistent",
        **T(128, 256, 64, 8, 3, group_m=16, epilogue_subtile=True, tail_split=8),
    ),
    C("128x256x64 w8 s3 sub stream-K", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True, stream_k=True)),
]


ODD = [  # A or B TMA cannot describe as given
    C("gemv fma 1x32x128 w4", "gemv", **T(1, 32, 128, 4, 1, split_k=0)),
    C("gemv fma 1x32x256 w8", "gemv", **T(1, 32, 256, 8, 1, split_k=0)),
    C("gemv dot 16x32x128 w4 s3", "gemv", **T(16, 32, 128, 4, 3, split_k=0)),
    C("gemv dot 64x64x64 w4 s3", "gemv", **T(64, 64, 64, 4, 3, split_k=0)),
    C("staged", stage=True),
    C(
        "staged 128x256 tail8",
        "tma_persistent",
        stage=True,
        **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8),
    ),
    C("portable 128x128x64 w8 s3", "portable", stage=False, **T(128, 128, 64, 8, 3)),
    C("portable 16x32x128 w4 s4", "portable", stage=False, **T(16, 32, 128, 4, 4)),
]


CANDIDATES = {"gemv": GEMV, "small": SMALL, "large": LARGE, "odd": ODD, "suite": []}


SPLIT_PATHS = ("tma_splitk", "gemv")  # paths with a split_k field: an unpinned split is chosen per shape
