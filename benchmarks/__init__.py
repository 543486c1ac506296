"""gemmlab's GPU measurement scripts, run through one entry point: ``python -m benchmarks [NAME [ARGS...]]``
from the repository root (``benchmarks/__main__.py`` lists them). Nothing in ``src/`` or ``tests/`` imports this
package; the results live beside it in ``results/``, indexed by ``results/index.json``."""
