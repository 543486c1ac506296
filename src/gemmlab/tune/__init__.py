"""The tuner: correctness-gated config search per shape, every attempt in the ledger, winners as data.

    from gemmlab.tune import tune, tune_shape, write_configs
"""

from gemmlab.tune.tuner import tune, tune_shape, write_configs

__all__ = ["tune", "tune_shape", "write_configs"]
