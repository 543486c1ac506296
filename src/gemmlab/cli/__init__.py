"""The ``gemmlab`` command: ``root`` holds the typer app and the commands' registration, one module per command
group beside it; each module parses arguments, calls the library and draws its own tables."""

from gemmlab.cli.root import app, main

__all__ = ["app", "main"]
