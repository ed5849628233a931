"""Commands: placeholder until this group lands."""

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the simflash app."""
