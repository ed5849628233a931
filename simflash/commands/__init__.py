"""The `simflash` subcommands, one module per group (each has register(app))."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

try:  # typer >= 0.20 runs on its own copy of click
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover
    from click import get_current_context  # type: ignore[no-redef]  # the same function, where typer runs on click


def make_console(stderr: bool = False) -> Console:
    """A console that keeps tables whole when output goes to a file or pipe (wide, not 80 columns)."""
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, width=None if probe.is_terminal else 160)


# Names the library uses for what a command's option feeds it, by the option's parameter name.
LIBRARY_NAMES = {"ns": "n", "ds": "d", "s_kernel": "kernel_speedup", "sram_bytes": "sram_kib", "n_q": "n",
                 "trace": "level", "o_accum_dtype": "fa1_o_accum", "timeout_s": "timeout"}


def _option(param: Any) -> str:
    """How the user spells a parameter: its longest --option, or the argument's METAVAR."""
    if param.param_type_name == "argument":
        return (param.metavar or param.name).upper()
    return max(param.opts, key=len)


def _params() -> dict[str, Any]:
    ctx = get_current_context(silent=True)
    return {} if ctx is None else {p.name: p for p in ctx.command.params if p.name}


def _path_param(filename: str | bytes | os.PathLike | None) -> Any | None:
    """The option whose value is `filename` (or a folder holding it), when one is."""
    ctx = get_current_context(silent=True)
    if ctx is None or filename is None:
        return None
    target = os.path.abspath(os.fsdecode(filename))
    best, best_length = None, -1
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(value, (str, Path)) and str(value):
            given = os.path.abspath(os.fsdecode(value))
            if given == target:
                return param
            if target.startswith(given.rstrip(os.sep) + os.sep) and len(given) > best_length:
                best, best_length = param, len(given)  # a file in a folder the user named
    return best


def _json_source(error: json.JSONDecodeError) -> tuple[Any | None, str]:
    """The option (and file) whose text failed to parse: a given file, or a JSON file in a given folder."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return None, ""
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if not isinstance(value, (str, Path)) or not str(value):
            continue
        path = Path(value)
        candidates = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.is_file() else []
        for candidate in candidates:
            try:
                if candidate.stat().st_size < 64 * 2**20 and candidate.read_text(errors="replace") == error.doc:
                    return param, str(candidate)
            except OSError:
                continue
    return None, ""


def bad_input(error: Exception) -> typer.BadParameter:
    """A user's mistake as click's usage error (exit status 2), naming the option the user typed."""
    params = _params()
    if isinstance(error, json.JSONDecodeError):
        param, source = _json_source(error)
        message = f"{source or 'the file'} is not valid JSON ({error.msg}, line {error.lineno})"
        return typer.BadParameter(message, param_hint=_option(param) if param else None)
    if isinstance(error, OSError):
        param = _path_param(error.filename)
        what = error.strerror or str(error)
        name = error.filename if error.filename is not None else ""
        message = f"{name}: {what}" if name else what
        return typer.BadParameter(message, param_hint=_option(param) if param else None)
    message = str(error)
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*) (must|has|is|should|field|file)\b", message)
    if match:
        word = match.group(1)
        name = word if word in params else LIBRARY_NAMES.get(word)
        if name in params:
            return typer.BadParameter(message[len(word) + 1:], param_hint=_option(params[name]))
    match = re.match(r"(--[a-z][a-z0-9-]*) (.*)", message, re.S)
    if match and any(match.group(1) in p.opts for p in params.values() if p.param_type_name != "argument"):
        return typer.BadParameter(match.group(2), param_hint=match.group(1))
    ctx = get_current_context(silent=True)
    given = {} if ctx is None else ctx.params
    for param in [] if ctx is None else ctx.command.params:  # a message quoting a path the user gave
        value = given.get(param.name)
        if isinstance(value, Path) and str(value) in message:
            return typer.BadParameter(message, param_hint=_option(param))
    return typer.BadParameter(message)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad input (ValueError, an unreadable or unwritable path, damaged JSON): a one-line error naming the
    option and exit status 2; a missing GPU or tool (RuntimeError): a one-line error, status 1."""
    try:
        yield
    except (ValueError, OSError) as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad_input(error) from None
    except RuntimeError as error:
        make_console(stderr=True).print(f"[red]error:[/red] {escape(str(error))}")
        raise typer.Exit(1) from None


JSON_HELP = "Print the result as JSON instead of tables."


def as_data(value: Any) -> Any:
    """attrs classes, tuples, paths and NumPy values as plain JSON data."""
    import attrs
    import numpy as np

    if attrs.has(type(value)):
        return {key: as_data(item) for key, item in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, dict):
        return {str(key): as_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_data(item) for item in value]
    if isinstance(value, np.ndarray):
        return as_data(value.tolist())
    if isinstance(value, np.generic):
        return as_data(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "-inf", "nan": strict JSON has no infinities (trace files write them so too)
    if isinstance(value, Path):
        return str(value)
    return value


def print_json(value: Any) -> None:
    """Print `value` as JSON on stdout (what --json gives on every command that prints tables)."""
    typer.echo(json.dumps(as_data(value), indent=2, allow_nan=False))


def guarded(callback: Callable) -> Callable:
    """`callback` run under user_errors: how the app wraps every command, in one place."""
    if getattr(callback, "__simflash_guarded__", False):
        return callback

    @functools.wraps(callback)
    def wrapper(*args, **kwargs):
        with user_errors():
            return callback(*args, **kwargs)

    wrapper.__simflash_guarded__ = True  # type: ignore[attr-defined]
    return wrapper


def guard_app(app: typer.Typer) -> None:
    """Wrap every command of `app` and of its sub-apps (plot, gpu) in user_errors."""
    for info in app.registered_commands:
        if info.callback is not None:
            info.callback = guarded(info.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            guard_app(group.typer_instance)
