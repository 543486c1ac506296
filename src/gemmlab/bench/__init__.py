"""Benchmark suites: each module describes what to time (shapes, providers, baselines) and hands it to the
instruments (``gemmlab.instruments``: timing, statistics, comparison). ``gemm`` (the broad GEMM suite),
``moe`` and ``moe_liger`` (MoE against composites and Liger-Kernel), ``model`` (whole models), ``moe_ep``
(expert parallel), ``stable`` (repeatability), ``table`` (the seed competition's tables), ``check``,
``probe`` (the device's measured ceilings) and ``inductor`` (torch.compile's GEMM as a baseline)."""
