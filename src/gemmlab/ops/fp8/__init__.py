"""FP8 (e4m3) details, imported by the public modules ``gemmlab.ops.gemm_fp8`` (``gemm_fp8``, ``quantize_fp8``) and
``gemmlab.ops.moe_fp8`` (``grouped_gemm_fp8``, ``pack_moe_fp8``) only (and by ``ops.introspect`` for the lab):

    checks       the FP8 argument checks (torch only, no kernel)
    quantize     the quantizer's plan per signature and its kept launch
    plan         the dense FP8 config, its planner and what a plan's kernel is compiled with
    decode       the dense FP8 decode path (small M): its config, when it is taken, its split-K and arguments
    launch       the dense FP8 plan per signature (a bounded cache) and its kept launch
    moe_checks   the FP8 experts' argument checks
    moe_config   the FP8 grouped GEMM's config and its TMA rules
    moe_launch   the FP8 grouped GEMM's launch (the FP8 MoE forward is an option of ``ops.moe.plan``)
    custom       ``torch.library`` registration of gemm_fp8, quantize_fp8 and the FP8 grouped ops
"""
