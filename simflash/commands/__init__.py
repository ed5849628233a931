"""The `simflash` subcommands, one module per group (each has register(app))."""

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    """A console that keeps tables whole when output goes to a file or pipe (wide, not 80 columns)."""
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, width=None if probe.is_terminal else 160)
