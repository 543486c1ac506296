"""FP8 models: ``Fp8Linear`` and ``Fp8MoEExperts``, e4m3 weights with one fp32 scale per 128x128 block, activations
quantized per 1x128 block on the fly (DeepSeek-V3's serving form).

Legend: M rows of x, N out_features, K in_features; T tokens, H hidden, I expert intermediate, E experts, k top-k;
Xb = cdiv(X, 128), the 128-blocks of a dimension X.

    Fp8Linear: weight (N, K) float8_e4m3fn, weight_scale_inv (Nb, Kb) fp32, bias (N,) or None;
        y (..., N) = q(x) @ (weight * weight_scale_inv)^T + bias, with x (..., K) quantized per 1x128 block of a
        row (``quantize_fp8(x, "block", (1, 128))``), then ``gemm_fp8`` (fp32 accumulation); y in x's dtype
    Fp8MoEExperts: gate_up_proj (E, 2I, H) e4m3 + gate_up_proj_scale_inv (E, cdiv(2I, 128), Hb) fp32,
        down_proj (E, H, I) e4m3 + down_proj_scale_inv (E, Hb, Ib) fp32; forward as ``MoEExperts`` through
        ``gemmlab.moe_forward`` on a ``PackedMoEFP8`` (SiLU(gate) * up, the intermediate quantized per 1x128 block)

The checkpoint convention is DeepSeek-V3's and the Qwen3 FP8 releases' (transformers' FineGrainedFP8, block size
128x128): the dequantized weight is ``weight * weight_scale_inv``, each scale over its 128x128 block (the last
blocks may be partial). The names are those checkpoints' (and transformers' FP8Linear / FP8Experts), so their state
dicts load unchanged; loading checks every FP8 tensor (an e4m3 weight of the module's shape, a scale of the block
shape) and raises one ValueError otherwise, instead of letting torch cast a bf16 weight to e4m3 without its scale.
Scales stored as bf16, fp16 or UE8M0 (float8_e8m0fnu) load too: each converts to fp32 exactly.

The FP8 tensors are buffers, not Parameters (no autograd: inference only; a RuntimeError where a gradient of the input
would be needed), and ``module.to(dtype)`` / ``.half()`` leave them in their dtypes (only the bias converts).
Where gemmlab's FP8 kernels cannot run (an fp32 input, a CPU without Triton's interpreter) or ``dispatch="torch"``,
the same arithmetic runs in torch (quantized activations, dequantized weights, fp32 products): the emulation.
Alignment: gemm_fp8 needs K % 16 == 0; Fp8Linear pads x and the weight with zero columns to the next multiple of
16 for the call (the same sums: a zero column changes no amax and adds nothing); Fp8MoEExperts needs H % 16 == 0
and I % 16 == 0 (else ValueError; ``quantize_`` leaves such experts as they are).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gemmlab.nn.linear import DTYPES, bad_input, check_dtype, check_sizes, gemmlab_runs
from gemmlab.nn.moe import MoEExperts
from gemmlab.ops import gemm_fp8 as ops_fp8
from gemmlab.ops import moe as ops_moe
from gemmlab.ops.moe_fp8 import PackedMoEFP8, pack_moe_fp8

FP8 = torch.float8_e4m3fn
BLOCK = 128  # the scale block edge: 1x128 for activations, 128x128 for weights
IN_DTYPES = DTYPES + (torch.float32,)  # inputs an FP8 module takes (fp32 runs the emulation)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16) + (
    (torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ()
)  # each converts to fp32 exactly
POLICIES = ("auto", "torch")


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def check_fp8_weight(who: str, name: str, w: object, scale: object, shape: tuple[int, ...]) -> None:
    """An FP8 weight of ``shape`` (..., N, K) in e4m3 and its scale (..., Nb, Kb) in a float dtype that converts to
    fp32 exactly; one ValueError naming the tensor otherwise."""
    want_s = (*shape[:-2], _cdiv(shape[-2], BLOCK), _cdiv(shape[-1], BLOCK))
    if not isinstance(w, torch.Tensor) or w.dtype != FP8 or tuple(w.shape) != shape:
        got = f"{w.dtype} of shape {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(
            f"{who}: {name} must be float8_e4m3fn of shape {shape}, got {got} (an FP8 checkpoint's "
            f"e4m3 weight; quantize a bf16 one with from_linear / from_experts or gemmlab.quantize_)"
        )
    if not isinstance(scale, torch.Tensor) or scale.dtype not in SCALE_DTYPES or tuple(scale.shape) != want_s:
        got = (
            f"{scale.dtype} of shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else type(scale).__name__
        )
        raise ValueError(
            f"{who}: {name}_scale_inv must be fp32 of shape {want_s} (one per 128x128 block of {name}), got {got}"
        )
    if w.device != scale.device:
        raise ValueError(f"{who}: {name} and its scale must be on one device, got {w.device}, {scale.device}")


def dequantize(q: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """q (..., R, C) times its scale (..., cdiv(R, rows), cdiv(C, cols)) broadcast per block, in fp32."""
    s = scale.float().repeat_interleave(rows, -2).repeat_interleave(cols, -1)
    return q.float() * s[..., : q.shape[-2], : q.shape[-1]]


def _quantized_rows(x2: torch.Tensor) -> torch.Tensor:
    """x2 (M, K) quantized per 1x128 block and dequantized, fp32 (the emulation's activations)."""
    q, s = ops_fp8.quantize_fp8(x2, "block", (1, BLOCK))
    return dequantize(q, s, 1, BLOCK)


def _refuse_grad(who: str, x: torch.Tensor) -> None:
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(
            f"{who}: FP8 modules have no autograd (inference only); call under torch.no_grad() or "
            "torch.inference_mode()"
        )


class _HeldDtypes(nn.Module):
    """A module whose FP8 buffers and their fp32 scales (``HELD``) keep their dtypes through ``.to(dtype)``,
    ``.half()`` and the like: a cast would drop the scales' precision or the weights' meaning."""

    HELD: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        held = {n: self._buffers[n] for n in self.HELD if self._buffers.get(n) is not None}
        super()._apply(fn, recurse)
        for n, old in held.items():
            new = self._buffers[n]
            if new.dtype != old.dtype:
                self._buffers[n] = old.to(new.device)
        return self

    def _check_state(self, state_dict: dict, prefix: str) -> None:
        """Every FP8 pair present in a state dict, checked before torch copies (and casts) it; scales in another
        float dtype converted to fp32 (exactly) in load_state_dict's own copy of the dict, so that ``assign=True``
        holds fp32 scales too."""
        for w in self.HELD[::2]:
            key = prefix + w + "_scale_inv"
            if prefix + w in state_dict or key in state_dict:
                check_fp8_weight(
                    type(self).__name__,
                    prefix + w,
                    state_dict.get(prefix + w, self._buffers[w]),
                    state_dict.get(key, self._buffers[w + "_scale_inv"]),
                    tuple(self._buffers[w].shape),
                )
            if key in state_dict and state_dict[key].dtype != torch.float32:
                state_dict[key] = state_dict[key].float()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        self._check_state(state_dict, prefix)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def _policy(dispatch: str) -> str:
    if dispatch not in POLICIES:
        raise ValueError(f"dispatch {dispatch!r}: one of {', '.join(POLICIES)}")
    return dispatch


class Fp8Linear(_HeldDtypes):
    """A Linear with an e4m3 weight (N, K) and its 128x128 block scales ``weight_scale_inv`` (Nb, Kb); x quantized
    per 1x128 block on the fly (see the module docstring). ``dtype``: the bias's dtype. ``dispatch``: "auto"
    (gemmlab's FP8 kernels where they run, else the torch emulation) or "torch" (always the emulation)."""

    HELD = ("weight", "weight_scale_inv")

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *, dispatch: str = "auto"
    ):
        check_sizes("Fp8Linear", 1, in_features=in_features, out_features=out_features)
        check_dtype("Fp8Linear", dtype)
        super().__init__()
        self.in_features, self.out_features, self.dispatch = in_features, out_features, _policy(dispatch)
        self.register_buffer("weight", torch.zeros((out_features, in_features), dtype=FP8, device=device))
        self.register_buffer(
            "weight_scale_inv",
            torch.ones((_cdiv(out_features, BLOCK), _cdiv(in_features, BLOCK)), dtype=torch.float32, device=device),
        )
        b = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        self.register_parameter("bias", b)

    @classmethod
    def from_fp8(
        cls,
        weight: torch.Tensor,
        weight_scale_inv: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        dispatch: str = "auto",
    ) -> Fp8Linear:
        """An Fp8Linear over a checkpoint's tensors (no copy where they are contiguous fp32 scales and an e4m3
        weight): weight (N, K) e4m3, weight_scale_inv (Nb, Kb), bias (N,) or None (kept as is: a Parameter stays
        the same object)."""
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(
                f"Fp8Linear: weight must be a 2-D (N, K) float8_e4m3fn tensor, got "
                f"{tuple(getattr(weight, 'shape', ())) or type(weight).__name__}"
            )
        shape = tuple(weight.shape)
        check_fp8_weight("Fp8Linear", "weight", weight, weight_scale_inv, shape)
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (shape[0],)):
            raise ValueError(
                f"Fp8Linear: bias must be a tensor of shape ({shape[0]},), got "
                f"{tuple(getattr(bias, 'shape', ())) or type(bias).__name__}"
            )
        new = cls(shape[1], shape[0], bias=False, device="meta", dispatch=dispatch)
        new.weight = weight.detach().contiguous()
        new.weight_scale_inv = weight_scale_inv.detach().float().contiguous()
        new.bias = bias if bias is None or isinstance(bias, nn.Parameter) else nn.Parameter(bias, requires_grad=False)
        return new

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dispatch: str = "auto") -> Fp8Linear:
        """Quantize an nn.Linear's weight (fp16/bf16/fp32, (N, K)) per 128x128 block (amax / 448 per block,
        ``quantize_fp8``'s rule); its bias Parameter is shared, in its own dtype."""
        w = getattr(linear, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in IN_DTYPES or w.device.type == "meta":
            raise ValueError(
                f"Fp8Linear.from_linear: needs a Linear whose weight is a materialized 2-D fp16, bf16 or "
                f"fp32 tensor, got {getattr(w, 'dtype', None)} on {getattr(w, 'device', None)}"
            )
        q, s = ops_fp8.quantize_fp8(w.detach(), "block", (BLOCK, BLOCK))
        return cls.from_fp8(q, s, linear.bias, dispatch=dispatch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, s, k = self.weight, self.weight_scale_inv, self.in_features
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != k:
            raise bad_input("Fp8Linear", x, k)
        if x.dtype not in IN_DTYPES:
            raise TypeError(f"Fp8Linear: input has dtype {x.dtype}; supported: bfloat16, float16, float32")
        _refuse_grad("Fp8Linear", x)
        x2 = x.reshape(-1, k)
        if self.dispatch == "torch" or not gemmlab_runs(x):
            y = (_quantized_rows(x2) @ dequantize(w, s, BLOCK, BLOCK).t()).to(x.dtype)
        else:
            if k % 16:  # gemm_fp8's alignment: zero columns, the same sums
                pad = 16 - k % 16
                x2 = F.pad(x2, (0, pad))
                w, w_narrow = w.new_zeros((w.shape[0], k + pad)), w
                w[:, :k] = w_narrow
            xq, xs = ops_fp8.quantize_fp8(x2, "block", (1, BLOCK))
            y = ops_fp8.gemm_fp8(xq, w.t(), xs, s.t(), out_dtype=x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"fp8=e4m3 128x128" + ("" if self.dispatch == "auto" else f", dispatch={self.dispatch!r}")
        )


def _experts_emulated(x, w1, s1, w2, s2, weights, ids) -> torch.Tensor:
    """The FP8 experts in torch: x (T, H) quantized per 1x128 block; per expert hit, SiLU(gate) * up in fp32, rounded
    to x's dtype and quantized per 1x128 block, times the dequantized w2, times the top-k weight, summed in fp32."""
    i = w2.shape[2]
    hit = torch.unique(ids).tolist()  # a host sync: this path is not the fast one
    if hit and not (0 <= hit[0] and hit[-1] < w1.shape[0]):
        raise ValueError(f"Fp8MoEExperts: top_k_index must be in [0, E={w1.shape[0]}), got ids {hit[0]}..{hit[-1]}")
    a = _quantized_rows(x)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in hit:
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        gate, up = (a[tok] @ dequantize(w1[e], s1[e], BLOCK, BLOCK).t()).split(i, dim=-1)
        h = _quantized_rows((F.silu(gate) * up).to(x.dtype))
        y.index_add_(0, tok, (h @ dequantize(w2[e], s2[e], BLOCK, BLOCK).t()) * weights[tok, slot, None].float())
    return y.to(x.dtype)


class Fp8MoEExperts(_HeldDtypes, MoEExperts):
    """E SwiGLU experts in FP8: ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I) in e4m3 with their 128x128
    block scales ``*_scale_inv`` (transformers' FP8Experts names); forward(hidden_states (T, H), top_k_index (T, k),
    top_k_weights (T, k)) -> (T, H) as ``MoEExperts`` (see the module docstring). A ``MoEExperts`` (the same call
    and names), so ``patch`` and ``MoE`` take it where they take one."""

    HELD = ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv")

    def __init__(
        self, num_experts: int, hidden: int, intermediate: int, device=None, dtype=None, *, dispatch: str = "auto"
    ):
        check_sizes("Fp8MoEExperts", 1, num_experts=num_experts, hidden=hidden, intermediate=intermediate)
        if hidden % 16 or intermediate % 16:
            raise ValueError(
                f"Fp8MoEExperts: hidden ({hidden}) and intermediate ({intermediate}) must be multiples "
                "of 16 (TMA rows of e4m3); such experts stay in bf16 (gemmlab.nn.MoEExperts)"
            )
        check_dtype("Fp8MoEExperts", dtype)
        nn.Module.__init__(self)  # (not MoEExperts.__init__: its weights are Parameters in a float dtype)
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, intermediate
        self.dispatch = _policy(dispatch)
        for name, (n, k) in (("gate_up_proj", (2 * intermediate, hidden)), ("down_proj", (hidden, intermediate))):
            self.register_buffer(name, torch.zeros((num_experts, n, k), dtype=FP8, device=device))
            self.register_buffer(
                name + "_scale_inv",
                torch.ones((num_experts, _cdiv(n, BLOCK), _cdiv(k, BLOCK)), dtype=torch.float32, device=device),
            )

    def reset_parameters(self) -> None:
        """Nothing to draw: FP8 experts hold a checkpoint's (or a quantized model's) weights."""

    @classmethod
    def from_fp8(
        cls,
        gate_up_proj: torch.Tensor,
        gate_up_proj_scale_inv: torch.Tensor,
        down_proj: torch.Tensor,
        down_proj_scale_inv: torch.Tensor,
        *,
        dispatch: str = "auto",
    ) -> Fp8MoEExperts:
        """Fp8MoEExperts over a checkpoint's tensors: gate_up_proj (E, 2I, H) e4m3 (gate rows first) with its scale
        (E, cdiv(2I, 128), Hb), down_proj (E, H, I) e4m3 with its scale (E, Hb, Ib)."""
        if not (isinstance(down_proj, torch.Tensor) and down_proj.dim() == 3):
            raise ValueError(
                f"Fp8MoEExperts: down_proj must be a 3-D (E, H, I) tensor, got "
                f"{tuple(getattr(down_proj, 'shape', ())) or type(down_proj).__name__}"
            )
        e, h, i = down_proj.shape
        check_fp8_weight("Fp8MoEExperts", "down_proj", down_proj, down_proj_scale_inv, (e, h, i))
        check_fp8_weight("Fp8MoEExperts", "gate_up_proj", gate_up_proj, gate_up_proj_scale_inv, (e, 2 * i, h))
        new = cls(e, h, i, device="meta", dispatch=dispatch)
        for name, t in (
            ("gate_up_proj", gate_up_proj),
            ("gate_up_proj_scale_inv", gate_up_proj_scale_inv),
            ("down_proj", down_proj),
            ("down_proj_scale_inv", down_proj_scale_inv),
        ):
            t = t.detach()
            setattr(new, name, (t if t.dtype == FP8 else t.float()).contiguous())
        return new

    @classmethod
    def from_experts(cls, experts: nn.Module, *, dispatch: str = "auto") -> Fp8MoEExperts:
        """Quantize experts in MoEExperts' layout (``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I), fp16, bf16
        or fp32) per 128x128 block of each expert (``pack_moe_fp8``'s rule)."""
        w1, w2 = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
        if not all(
            isinstance(w, torch.Tensor) and w.dim() == 3 and w.dtype in IN_DTYPES and w.device.type != "meta"
            for w in (w1, w2)
        ):
            raise ValueError(
                "Fp8MoEExperts.from_experts: needs materialized 3-D fp16/bf16/fp32 gate_up_proj "
                "(E, 2I, H) and down_proj (E, H, I)"
            )
        e, h, i = w2.shape
        if h % 16 or i % 16:  # (checked before quantizing: the constructor says why)
            cls(e, h, i, device="meta")
        packed = pack_moe_fp8(w1.detach(), w2.detach())
        return cls.from_fp8(packed.w1, packed.w1_scale, packed.w2, packed.w2_scale, dispatch=dispatch)

    @classmethod
    def sharing(cls, experts: nn.Module) -> Fp8MoEExperts:
        """Fp8MoEExperts holding an FP8 experts module's own tensors (transformers' FP8Experts:
        ``gate_up_proj`` and ``down_proj`` in e4m3 with their ``*_scale_inv``)."""
        names = ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv")
        new = cls.from_fp8(*(getattr(experts, n, None) for n in names))
        new.train(experts.training)
        return new

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden_states (T, H) or (..., H); top_k_index, top_k_weights (T, k) or (..., k)."""
        h = self.hidden_dim
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() == 0 or hidden_states.shape[-1] != h:
            raise bad_input("Fp8MoEExperts", hidden_states, h, "hidden")
        if hidden_states.dtype not in IN_DTYPES:
            raise TypeError(
                f"Fp8MoEExperts: input has dtype {hidden_states.dtype}; supported: bfloat16, float16, float32"
            )
        _refuse_grad("Fp8MoEExperts", hidden_states)
        w1, s1, w2, s2 = self.gate_up_proj, self.gate_up_proj_scale_inv, self.down_proj, self.down_proj_scale_inv
        if self.dispatch == "torch" or not gemmlab_runs(hidden_states):
            k = top_k_index.shape[-1]
            y = _experts_emulated(
                hidden_states.reshape(-1, h), w1, s1, w2, s2, top_k_weights.reshape(-1, k), top_k_index.reshape(-1, k)
            )
            return y.view(hidden_states.shape)
        packed = PackedMoEFP8(w1, s1, w2, s2)  # (checked at load; the op checks its operands again)
        return ops_moe.moe_forward(hidden_states, packed, None, top_k_weights, top_k_index, validate=True)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + ", fp8=e4m3 128x128"
            + ("" if self.dispatch == "auto" else f", dispatch={self.dispatch!r}")
        )
