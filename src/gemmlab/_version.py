"""gemmlab's version: the one source (pyproject.toml reads it, ``gemmlab.__version__`` and ``--version`` show it)."""

__version__ = "0.1.0"
