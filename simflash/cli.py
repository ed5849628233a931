"""The `simflash` command. Each group of subcommands lives in its own module under simflash.commands."""

from __future__ import annotations

import importlib

import typer

from simflash.commands import guard_app

app = typer.Typer(
    name="simflash",
    help="See where every byte of attention goes: simulate, trace, model and measure FlashAttention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """See where every byte of attention goes: simulate, trace, model and measure FlashAttention."""


# Modules under simflash.commands; each has register(app) adding its commands.
COMMAND_MODULES = ("run", "bench", "teach", "files", "analysis", "gpu", "physical", "tiles", "view", "decode")

for _module in COMMAND_MODULES:
    importlib.import_module(f"simflash.commands.{_module}").register(app)

# Ordinary mistakes (a bad value, a missing or unwritable path, damaged JSON) become one line naming the
# option, exit status 2, for every command: handled here, not per command.
guard_app(app)


def main() -> None:
    app()
