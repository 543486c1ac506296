"""The tuner: correctness-gated config search per problem (GEMM shapes, MoE grouped GEMMs), every attempt
in the ledger, winners as data in the user's config file.

    from gemmlab.tune import tune, tune_moe, tune_shape, write_configs
"""

from gemmlab.tune.tuner import tune, tune_moe, tune_shape, write_configs

__all__ = ["tune", "tune_moe", "tune_shape", "write_configs"]
