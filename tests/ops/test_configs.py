"""Config tables: the user's file before the bundled one (per path, rule by rule), which file and rule a
config came from, malformed files refused with the file named, the MoE tiles as data reproducing the
if-ladder they replaced, and the interpreter following the same lookup."""

import json

import pytest
import torch
import triton

import gemmlab
from gemmlab.device import SM90_SMEM_BYTES as SMEM_BYTES
from gemmlab.device import Target
from gemmlab.ops import configs
from gemmlab.ops.moe import MoEConfig, moe_choice, moe_config
from tests.conftest import rand

H200 = Target("nvidia-h200", (9, 0), 132)
OTHER = Target("nvidia-a100-sxm4-80gb", (8, 0), 108)  # no file of its own: default.json
INTERP = Target("interpreter", (9, 0), 3)


def _ladder(target: Target, rows: int, experts: int, mode: int, elt: int = 2, max_group: int = 0) -> MoEConfig:
    """The if-ladder ``moe_config`` was before its choices became data (kept as the oracle; since issue 15
    16-row tiles need every group bounded by 16 rows, not the mean)."""
    used = max(1, min(experts, rows))
    avg = rows / used
    bound = min(rows, max_group) if max_group else rows
    if target.name == "interpreter":
        return MoEConfig(block_m=16 if avg <= 16 else 32, block_n=32, block_k=32, num_warps=4, num_stages=1)
    per_sm = 1
    if target.name == "nvidia-h200" and mode in (1, 2) and (bound <= 16 or (bound <= 64 and avg <= 8)):
        # sweep_moe_small (2026-12-01): narrower gate/up tiles, deeper K, two programs per SM
        bm, bn, bk, warps, stages, per_sm = 16, 64 if mode == 1 else 128, 128, 4, 3, 2
    elif bound <= 16:
        bm, bn, bk, warps, stages = 16, 128, 64, 4, 4
    elif avg <= 48:  # two fp32 accumulators (gate, up) need two warpgroups at 64 rows (4 warps spill)
        bm, bn, bk, warps, stages = (64, 128, 64, 8, 4) if mode == 1 else (64, 128, 128, 4, 3)
    else:
        bm, bn, bk, warps, stages = (128, 128, 64, 8, 4) if mode == 1 else (128, 256, 64, 8, 4)
    w_tiles = 2 if mode == 1 else 1
    staging = bm * bn // 2 * elt  # the TMA store's buffer (half a tile)
    while stages > 2 and stages * (bm * bk + w_tiles * bn * bk) * elt + staging > SMEM_BYTES // per_sm - 1024:
        stages -= 1
    return MoEConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, programs_per_sm=per_sm)


def test_moe_tables_reproduce_the_ladder(user_dir):
    rows = sorted(
        {
            0,
            1,
            2,
            15,
            16,
            17,
            31,
            32,
            33,
            47,
            48,
            49,
            50,
            63,
            64,
            95,
            96,
            97,
            127,
            128,
            129,
            255,
            256,
            257,
            767,
            768,
            769,
            1000,
            1023,
            1024,
            4096,
            8192,
            8193,
            32768,
            131072,
            1 << 20,
        }
    )
    experts = (0, 1, 2, 3, 8, 16, 60, 64, 128, 256, 257)
    n = 0
    for target in (H200, OTHER, INTERP):
        for s in rows:
            for e in experts:
                for mode in (0, 1, 2):
                    for elt in (2, 4):  # 4: a dtype the tables do not know; the stage trim still applies
                        for dtype in (None, torch.float16, torch.bfloat16):
                            got = moe_config(target, s, e, mode, elt, dtype=dtype, n=4096, k=7168)
                            assert got == _ladder(target, s, e, mode, elt), (target.name, s, e, mode, elt)
                            n += 1
            for e in experts:  # with the host's bound on the largest group (moe_forward passes T)
                for mg in (1, 16, 17, 64, 1 << 20):
                    got = moe_config(target, s, e, 1, 2, dtype=torch.bfloat16, n=4096, k=7168, max_group=mg)
                    assert got == _ladder(target, s, e, 1, 2, mg), (target.name, s, e, mg)
    assert n > 10000


def test_a_partial_user_file_wins_where_it_matches_and_falls_through_elsewhere(user_dir):
    mine = {"block_m": 32, "block_n": 64, "block_k": 32, "num_warps": 4, "num_stages": 2, "group_m": 4}
    (user_dir / "nvidia-h200.json").write_text(
        json.dumps(
            {
                "moe": {
                    "gate_up": [
                        {"rows_per_expert": [17, 48], "experts": [256, 256], "dtype": "bfloat16", "config": mine}
                    ]
                }
            }
        )
    )
    configs.reload()
    cfg, why = moe_choice(H200, 8192, 256, 1, dtype=torch.bfloat16, n=2048, k=7168)  # 32 rows per expert
    assert cfg == MoEConfig(**mine)
    assert str(user_dir / "nvidia-h200.json") in why and "moe.gate_up[0]" in why and "rows_per_expert 17..48" in why
    # another dtype, another expert count, another mode, another regime: the bundled rules
    for args, kw in (
        ((8192, 256, 1), {"dtype": torch.float16}),
        ((8192, 128, 1), {"dtype": torch.bfloat16}),
        ((8192, 256, 2), {"dtype": torch.bfloat16}),
        ((256, 256, 1), {"dtype": torch.bfloat16}),
    ):
        cfg, why = moe_choice(H200, *args, **kw)
        assert cfg == _ladder(H200, *args) and "src/gemmlab/configs/nvidia-h200.json" in why, (args, why)


def test_plan_reason_names_file_and_rule_user_first(user_dir):
    a, b = rand((48, 128)), rand((128, 64))
    p = gemmlab.plan(a, b)
    assert "gemmlab/configs/interpreter.json gemm.tma_splitk[0] (any shape)" in p.reason, p.reason
    mine = {"block_m": 16, "block_n": 64, "block_k": 64, "split_k": 2}
    (user_dir / "interpreter.json").write_text(
        json.dumps(
            {
                "gemm": {
                    "tma_splitk": [{"m": [33, 64], "n": [33, 64], "k": [65, 128], "dtype": "float16", "config": mine}]
                }
            }
        )
    )
    assert gemmlab.plan(a, b).reason == p.reason  # loaded once per process ...
    configs.reload()  # ... until reloaded
    p = gemmlab.plan(a, b)
    assert p.config.block_n == 64 and p.config.block_k == 64 and p.config.split_k == 2
    assert f"{user_dir / 'interpreter.json'} gemm.tma_splitk[0] (m 33..64, n 33..64, k 65..128, float16)" in p.reason
    assert "interpreter.json gemm.tma_splitk[0] (any shape)" in gemmlab.plan(rand((16, 128)), b).reason  # outside
    assert "gemm.tma_splitk" not in gemmlab.plan(a, b, config=gemmlab.GemmConfig()).reason.split(";")[-1]
    assert "given by the caller" in gemmlab.plan(a, b, config=gemmlab.GemmConfig()).reason


def test_gemmlab_home_is_the_default_user_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("GEMMLAB_CONFIGS", raising=False)
    monkeypatch.setenv("GEMMLAB_HOME", str(tmp_path))
    assert configs.user_dir() == tmp_path / "configs"
    monkeypatch.delenv("GEMMLAB_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert configs.user_dir() == tmp_path / "h" / ".gemmlab" / "configs"
    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path / "c"))
    assert configs.user_dir() == tmp_path / "c"


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", "cannot be read as JSON"),
        ('{"gemm": {"tma_splitk": [{"mm": [1, 2], "config": {}}]}}', "unknown key(s) ['mm']"),
        ('{"gemm": {"tma_spltk": []}}', "unknown gemm path 'tma_spltk'"),
        ('{"gemms": {}}', "unknown key(s) ['gemms']"),
        ('{"gemm": {"tma_splitk": [{"m": [64, 1], "config": {}}]}}', "lo <= hi"),
        ('{"gemm": {"tma_splitk": [{"m": [1.5, 2], "config": {}}]}}', "integers"),
        ('{"gemm": {"tma_splitk": [{"dtype": "fp16", "config": {}}]}}', "dtype must be one of"),
        ('{"gemm": {"tma_splitk": [{"m": [1, 2]}]}}', 'a "config" object'),
        ('{"gemm": {"tma_splitk": [{"config": {"blockm": 16}}]}}', "unknown GemmConfig keys ['blockm']"),
        ('{"moe": {"down": [{"config": {"block_m": 16, "stages": 2}}]}}', "unknown MoEConfig keys ['stages']"),
        ('{"route": {"gemm": [{"m": [0, 4], "config": {"path": "warp"}}]}}', "a route's config is"),
        ('{"route": {"gemm": [{"config": {"path": "gemv", "block_m": 1}}]}}', "a route's config is"),
        ('{"route": {"gemv": []}}', "unknown route path 'gemv'"),
        ('{"gemm": {"gemv": [{"tma": [0, 0], "config": {}}]}}', "unknown key(s) ['tma']"),
    ],
)
def test_a_malformed_user_file_is_refused_naming_it(user_dir, text, words):
    (user_dir / "interpreter.json").write_text(text)
    configs.reload()
    with pytest.raises(ValueError) as e:
        gemmlab.plan(rand((48, 128)), rand((128, 64)))
        moe_config(INTERP, 64, 4, 2)
    assert str(user_dir / "interpreter.json") in str(e.value) and words in str(e.value), str(e.value)


def test_tune_configs_dir_is_what_plan_reads_when_gemmlab_configs_points_there(tmp_path, monkeypatch):
    from dataclasses import asdict

    from gemmlab.tune.tuner import write_configs

    best = gemmlab.GemmConfig(block_m=16, block_n=64, block_k=64, split_k=2)
    result = {
        "confirmed": True,
        "section": "gemm",
        "path": "tma_splitk",
        "dtype": "float16",
        "shape": [48, 64, 128],
        "ranges": {"m": [33, 64], "n": [33, 64], "k": [65, 128]},
        "best": asdict(best),
        "best_entry": 7,
        "session": "s",
        "confirm": {"speedup": {"ratio": 1.2, "ci95": [1.1, 1.3]}},
    }
    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path / "elsewhere"))
    configs.reload()
    try:
        path = write_configs([result], "interpreter", tmp_path / "mine")  # tune --configs-dir tmp/mine
        assert path == tmp_path / "mine" / "interpreter.json" and not (tmp_path / "elsewhere").exists()
        a, b = rand((48, 128)), rand((128, 64))
        assert str(path) not in gemmlab.plan(a, b).reason  # not the directory plan reads ...
        monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path / "mine"))  # ... until it is
        configs.reload()
        p = gemmlab.plan(a, b)
        assert p.config == best and f"{path} gemm.tma_splitk[0]" in p.reason
        data = json.loads(path.read_text())
        assert data["gemm"]["tma_splitk"][0]["tuned"]["ledger_entry"] == 7 and data["triton"] == triton.__version__
    finally:
        monkeypatch.undo()
        configs.reload()


def test_a_file_may_record_the_triton_it_was_tuned_with(user_dir):
    (user_dir / "interpreter.json").write_text('{"about": "mine", "triton": "3.6.0", "gemm": {}}')
    configs.reload()
    p = gemmlab.plan(rand((48, 128)), rand((128, 64)))  # read without complaint; no rules: the bundled ones
    assert configs.files("interpreter")[0] == user_dir / "interpreter.json"
    assert str(configs.BUNDLED_DIR / "interpreter.json") in p.reason


def test_reload_runs_the_hooks_of_caches_built_from_the_tables(monkeypatch):
    calls = []
    monkeypatch.setattr(configs, "_ON_RELOAD", [])
    configs.on_reload(lambda: calls.append(1))
    configs.reload()
    assert calls == [1]
