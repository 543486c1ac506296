"""The command modules of `gemmlab` (cli.py registers them): argument handling only."""
