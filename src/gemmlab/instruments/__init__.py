"""Instruments, shared by the grader, the benchmark suites, the tuner and the ledger, importing none of them:

timing    device-synced clocks, L2 flushes, interleaved rounds, NVML clock sampling, environment facts
stats     the one statistics module: summaries, ratio intervals, verdicts (faster / slower / inconclusive)
compare   interleaved comparisons of providers at one problem
sass      compiled kernels' SASS: tensor-core instructions, spills
ncu       Nsight Compute profiles of one verified call (``ncu_target`` is the profiled program,
          ``ncu_view`` renders them)
"""
