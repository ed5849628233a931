"""The `simflash` subcommands, one module per group (each has register(app))."""

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape


def make_console(stderr: bool = False) -> Console:
    """A console that keeps tables whole when output goes to a file or pipe (wide, not 80 columns)."""
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, width=None if probe.is_terminal else 160)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad input: a one-line error and exit status 2; a missing GPU or tool: a one-line error, status 1."""
    try:
        yield
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    except RuntimeError as error:
        make_console(stderr=True).print(f"[red]error:[/red] {escape(str(error))}")
        raise typer.Exit(1) from None
