"""Commands for learning the algorithm: `trace` (the online softmax, tile by tile), `verify` (the causal
skip bound and mask, checked against direct attention) and `scopes` (what lives on chip, at which scope).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import typer

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.commands import JSON_HELP, print_json
from simflash.api import VARIANTS
from simflash.config import (
    CAUSAL_VARIANTS, DEFAULT_GPU, STORAGE_DTYPE_NAMES, STORAGE_DTYPES, KiB, check_choice, check_positive_int,
)
from simflash.scopes import on_chip_scopes
from simflash.verify import causal_checks, exercise4_checks
from simflash.walkthrough import (
    EXAMPLE_SCORES,
    EXAMPLE_VALUES,
    RandomWalkthrough,
    ScoresWalkthrough,
    random_walkthrough,
    scores_walkthrough,
)

# ---------------------------------------------------------------------------------------------- text


def _num(x: float) -> str:
    return f"{x:.4f}" if np.isfinite(x) else ("-inf" if x < 0 else "inf")


def _vec(values: Sequence[float] | np.ndarray | None, limit: int = 6) -> str:
    if values is None:  # a state the walkthrough does not record
        return "-"
    shown = [_num(float(x)) for x in values[:limit]]
    return "[" + ", ".join(shown) + (", ..." if len(values) > limit else "") + "]"


def _size(nbytes: int) -> str:
    if nbytes < KiB:
        return f"{nbytes} B"
    return f"{nbytes // KiB} KiB" if nbytes % KiB == 0 else f"{nbytes / KiB:.2f} KiB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(line, widths)).rstrip() for line in (header, *rows)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- trace


def _parse_matrix(text: str, option: str, form: str) -> list[list[float]]:
    try:
        rows = [[float(x) for x in row.split(",")] for row in text.split(";")]
    except ValueError:
        raise typer.BadParameter(f"must be {form}, got {text!r}", param_hint=option) from None
    if not np.isfinite([x for row in rows for x in row]).all():
        raise typer.BadParameter(f"must hold finite numbers, got {text!r}", param_hint=option)
    return rows


def _check_problem(scores: list[list[float]], values: list[list[float]], source: str) -> None:
    """Scores grouped in KV tiles (all as long as the first, the last may be shorter), one value row per key."""
    if not scores or any(len(tile) == 0 for tile in scores):
        raise typer.BadParameter("every KV tile needs at least one score", param_hint=source)
    block_kv = len(scores[0])
    if any(len(tile) != block_kv for tile in scores[:-1]) or len(scores[-1]) > block_kv:
        lengths = [len(tile) for tile in scores]
        raise typer.BadParameter(
            f"KV tiles must all hold {block_kv} scores (the last may hold fewer), got tile lengths {lengths}",
            param_hint=source,
        )
    n_kv = sum(len(tile) for tile in scores)
    if len(values) != n_kv:
        raise typer.BadParameter(f"need one value row per score ({n_kv}), got {len(values)} rows", param_hint=source)
    if len({len(row) for row in values}) != 1 or not values[0]:
        raise typer.BadParameter("value rows must all have the same length d >= 1", param_hint=source)


def _load_json(path: Path) -> tuple[list[list[float]], list[list[float]]]:
    form = 'a JSON object {"scores": [[8, 6], [10, 7]], "values": [[1, 2], [3, 4], [5, 6], [7, 8]]}'
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise typer.BadParameter(f"cannot read {path}: {error.strerror}", param_hint="--problem") from None
    except json.JSONDecodeError as error:
        raise typer.BadParameter(f"{path} is not valid JSON ({error.msg}, line {error.lineno}); expected {form}",
                                 param_hint="--problem") from None
    if not isinstance(data, dict) or set(data) != {"scores", "values"}:
        raise typer.BadParameter(f"{path} must hold {form}", param_hint="--problem")
    matrices = []
    for key in ("scores", "values"):
        rows = data[key]
        if not (isinstance(rows, list) and all(isinstance(r, list) for r in rows)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for r in rows for x in r)):
            raise typer.BadParameter(f'"{key}" in {path} must be a list of lists of numbers', param_hint="--problem")
        if not np.isfinite(np.array([x for r in rows for x in r], dtype=float)).all():
            raise typer.BadParameter(f'"{key}" in {path} must hold finite numbers', param_hint="--problem")
        matrices.append([[float(x) for x in r] for r in rows])
    return matrices[0], matrices[1]


def _parse_rows(text: str, n: int) -> list[int]:
    try:
        rows = [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"must be comma-separated query row indices, got {text!r}",
                                 param_hint="--rows") from None
    outside = [r for r in rows if not 0 <= r < n]
    if outside:
        raise typer.BadParameter(f"must lie in [0, {n}), got {outside}", param_hint="--rows")
    return rows


def _render_scores(w: ScoresWalkthrough) -> str:
    rows = [[str(t.j + 1), _vec(t.scores), _num(t.m), _num(t.alpha), _vec(t.weights), _num(t.l), _vec(t.accumulator),
             t.what_changed] for t in w.tiles]
    lines = [
        f"{w.title}, one query row, {len(w.tiles)} KV tiles of {w.block_kv} keys, d = {w.d} (simulated: scale 1, float32, block_q 1, q = e_0, key c = (score_c, 0, ...))",
        "",
        _table(["tile", "scores", "m", "alpha", "w = exp(s - m)", "l", w.accumulator, "what changed"], rows),
        "",
        f"final: {w.final_rule}",
        f"  O = {_vec(w.output)}",
        f"  O as stored in HBM: {_vec(w.stored_output)}",
        "",
        "check against the softmax of the full row, in float64:",
        f"  scores {_vec(w.row_scores, limit=12)}",
        f"  weights {_vec(w.row_weights, limit=12)}",
        f"  weighted sum of the values {_vec(w.weighted_sum)}",
        f"  max |O - weighted sum| = {w.max_abs_error:.2e}",
    ]
    return "\n".join(lines)


def _render_random(w: RandomWalkthrough) -> str:
    out = [
        f"{w.title}, n_q = {w.n_q}, n_kv = {w.n_kv}, d = {w.d}, block_q = {w.block_q}, block_kv = {w.block_kv}, "
        f"{w.dtype}, " + (f"causal ({w.causal_variant})" if w.causal else "not causal") + f", seed {w.seed}",
    ]
    for row in w.rows:
        table = [[str(t.j), t.kind, _num(t.m), _num(t.alpha), _num(t.l), _vec(t.accumulator), t.what_changed]
                 for t in row.tiles]
        out += [
            "",
            f"query row {row.row} (query tile {row.query_tile}, row {row.row_in_tile} of it): "
            f"{len(row.tiles)} KV tiles visited",
            _table(["j", "kind", "m", "alpha", "l", w.accumulator, "what changed"], table),
            f"final: {w.final_rule}",
            f"  O[{row.row}] as stored in HBM: {_vec(row.stored_output)}",
            f"  float64 reference:       {_vec(row.reference)}",
            f"  max |O - reference| = {row.max_abs_error:.2e}",
        ]
    return "\n".join(out)


def trace_command(
    scores: str | None = typer.Option(None, "--scores", help='Scores per KV tile: "8,6;10,7" (tiles split by ";").'),
    values: str | None = typer.Option(None, "--values", help='One value row per key: "1,2;3,4;5,6;7,8".'),
    json_file: Path | None = typer.Option(None, "--problem", help='A JSON file {"scores": [[...], ...], '
                                             '"values": [...]} (an input; --json is the output flag).'),
    n: int | None = typer.Option(None, "--n", help="Random configuration: query rows (default 16)."),
    n_kv: int | None = typer.Option(None, "--n-kv", help="Key rows (default: n)."),
    d: int | None = typer.Option(None, "--d", help="Head dimension (default 4)."),
    block_q: int | None = typer.Option(None, "--block-q", help="Query tile rows B_r (default 4)."),
    block_kv: int | None = typer.Option(None, "--block-kv", help="KV tile rows B_c (default 2)."),
    causal: bool | None = typer.Option(None, "--causal/--no-causal", help="Causal masking (default off)."),
    causal_variant: str | None = typer.Option(None, "--causal-variant", help=f"One of {CAUSAL_VARIANTS}."),
    rows: str | None = typer.Option(None, "--rows", help='Query rows to show: "0,5" (default: 0).'),
    seed: int | None = typer.Option(None, "--seed", help="Random seed (default 0).", min=0),
    dtype: str | None = typer.Option(None, "--dtype", help=f"Storage dtype, one of {sorted(STORAGE_DTYPES)}."),
    variant: str = typer.Option("fa2", "--variant", help=f"One of {sorted(FLASH_ALGORITHMS)}."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Watch the online softmax tile by tile: m, alpha, l and the accumulator after every KV tile.

    With no arguments: the two-tile worked example (scores [8, 6] then [10, 7]).

    --scores/--values or --problem: your own scores and values for one query row.

    --n, --d, --block-q, ...: a random problem, one table per chosen query row.
    """
    chosen = check_choice("variant", variant, VARIANTS)
    random_options = {"--n": n, "--n-kv": n_kv, "--d": d, "--block-q": block_q, "--block-kv": block_kv,
                      "--causal": causal, "--causal-variant": causal_variant, "--rows": rows, "--seed": seed,
                      "--dtype": dtype}
    random_given = [name for name, value in random_options.items() if value is not None]
    if json_file is not None and (scores is not None or values is not None):
        raise typer.BadParameter("give either --problem or --scores/--values, not both", param_hint="--problem")
    if (scores is None) != (values is None):
        raise typer.BadParameter("--scores and --values go together", param_hint="--scores/--values")
    if causal_variant is not None and not causal:
        raise typer.BadParameter("applies to causal attention: add --causal", param_hint="--causal-variant")
    if (json_file is not None or scores is not None) and random_given:
        raise typer.BadParameter(f"options of a random problem ({', '.join(random_given)}) do not combine with "
                                 "given scores", param_hint=random_given[0])
    walkthrough: ScoresWalkthrough | RandomWalkthrough
    if json_file is not None:
        score_tiles, value_rows = _load_json(json_file)
        _check_problem(score_tiles, value_rows, "--problem")
        walkthrough = scores_walkthrough(score_tiles, value_rows, chosen)
    elif scores is not None and values is not None:  # given together (checked above)
        score_tiles = _parse_matrix(scores, "--scores", 'scores per KV tile, "8,6;10,7"')
        value_rows = _parse_matrix(values, "--values", 'one row of numbers per key, "1,2;3,4;5,6;7,8"')
        _check_problem(score_tiles, value_rows, "--scores/--values")
        walkthrough = scores_walkthrough(score_tiles, value_rows, chosen)
    elif random_given:
        size = 16 if n is None else check_positive_int("--n", n)
        sizes = {option: check_positive_int(option, value if value is not None else default) for option, value, default
                 in (("--n-kv", n_kv, size), ("--d", d, 4), ("--block-q", block_q, 4), ("--block-kv", block_kv, 2))}
        walkthrough = random_walkthrough(
            size, sizes["--n-kv"], sizes["--d"], sizes["--block-q"], sizes["--block-kv"], bool(causal),
            check_choice("causal_variant", causal_variant or "upper_left", CAUSAL_VARIANTS), chosen,
            check_choice("dtype", dtype or "float16", STORAGE_DTYPE_NAMES), _parse_rows(rows or "0", size),
            0 if seed is None else seed,
        )
    else:
        walkthrough = scores_walkthrough(EXAMPLE_SCORES, EXAMPLE_VALUES, chosen)
    if as_json:
        print_json(walkthrough)
    elif isinstance(walkthrough, ScoresWalkthrough):
        typer.echo(_render_scores(walkthrough))
    else:
        typer.echo(_render_random(walkthrough))


# ---------------------------------------------------------------------------------------- verify


def verify_command(
    seed: int = typer.Option(0, "--seed", help="Random seed of the small causal problem.", min=0),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Check causal tiled attention: masked tiles agree with direct masked attention, a missing mask is caught."""
    checks = [*causal_checks(seed=seed), *exercise4_checks()]
    if as_json:
        print_json({"seed": seed, "checks": checks, "passed": sum(c.passed for c in checks)})
        if not all(c.passed for c in checks):
            raise typer.Exit(code=1)
        return
    for check in checks:
        typer.echo(f"{'PASS' if check.passed else 'FAIL'}  {check.name}\n      {check.detail}")
    failed = sum(not check.passed for check in checks)
    typer.echo(f"\n{len(checks) - failed} of {len(checks)} checks passed")
    if failed:
        raise typer.Exit(code=1)


# ---------------------------------------------------------------------------------------- scopes


def scopes_command(
    n: int = typer.Option(4096, "--n", help="Query rows N."),
    d: int = typer.Option(128, "--d", help="Head dimension."),
    block_q: int = typer.Option(128, "--block-q", help="Query tile rows B_r."),
    block_kv: int = typer.Option(64, "--block-kv", help="KV tile rows B_c."),
    dtype: str = typer.Option("float16", "--dtype", help=f"Storage dtype, one of {sorted(STORAGE_DTYPES)}."),
    n_kv: int | None = typer.Option(None, "--n-kv",
                                       help="Key rows (default kv_stages x B_c: no scope depends on it)."),
    kv_stages: int = typer.Option(2, "--kv-stages", help="K_j, V_j buffers in shared memory: 2 (the kernel's) or 1."),
    p_registers: str = typer.Option("overwrite_s", "--p-registers",
                                    help="Where P_ij waits for P V: overwrite_s (over S_ij, kernel v1/v2) or own "
                                         "(beside S_ij in the storage dtype, kernel v3, FlashAttention-3)."),
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="GPU whose shared memory and register file bound the tiles."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """What lives on chip: shared memory and registers per query tile, and the scopes of the statistics."""
    report = on_chip_scopes(n, d, block_q, block_kv, check_choice("dtype", dtype, STORAGE_DTYPE_NAMES), n_kv=n_kv,
                            kv_stages=kv_stages, gpu=gpu, p_registers=p_registers)
    if as_json:
        print_json(report)
        return

    def occupancy(field: str, peak: str) -> tuple[list[str], list[list[str]]]:
        names = list(dict.fromkeys(name for tile in report.tiles for name in getattr(tile, field)))
        return names, [[f"{t.first}-{t.last}" if t.last > t.first else str(t.first),
                        *(_size(getattr(t, field).get(name, 0)) for name in names), _size(getattr(t, peak))]
                       for t in report.tiles]

    shared_names, shared_rows = occupancy("buffer_bytes", "peak_bytes")
    register_names, register_rows = occupancy("register_bytes", "register_peak_bytes")
    lines = [
        f"FlashAttention-2 on the simulated GPU, one head: N = {report.n_q}, d = {report.d}, {report.dtype}, "
        f"B_r = {report.block_q}, B_c = {report.block_kv}, {report.threads} threads per CTA",
        f"(run with n_kv = {report.n_kv}; any n_kv >= {report.kv_stages} x B_c gives the same numbers below)",
        "",
        f"shared memory per query tile: Q_i and {report.kv_stages} stage(s) of K_j, V_j "
        f"(capacity {_size(report.capacity_bytes)}):",
        _table(["query tiles", *shared_names, "peak"], shared_rows),
        "",
        f"registers per query tile, float32"
        f"{'; P_ij overwrites S_ij' if report.p_registers == 'overwrite_s' else '; P_ij beside S_ij, storage dtype'} "
        f"(capacity {_size(report.register_capacity_bytes)}, {report.threads} threads):",
        _table(["query tiles", *register_names, "peak"], register_rows),
        "",
        "the lesson's tile sizes (section 2), named as what they are:",
        _table(["tile", "size"], [[name, _size(nbytes)] for name, nbytes in report.lesson_tiles.items()]),
        "",
        "the softmax statistics, three scopes:",
        _table(["scope", "what it counts", "size"], [
            ["running state, one head", "m and l: one float32 each per query row, over all CTAs",
             _size(report.head_state_bytes)],
            ["live state, one CTA", f"m_i and l_i for B_r = {report.block_q} rows", _size(report.cta_stats_bytes)],
            ["", "+ accumulator a_i, B_r x d float32", _size(report.cta_accumulator_bytes)],
            ["exported logsumexp", "L = m + log l, one float32 per query row, written to HBM",
             _size(report.logsumexp_bytes)],
        ]),
    ]
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    """Add the teaching commands to the simflash app."""
    app.command("trace")(trace_command)
    app.command("verify")(verify_command)
    app.command("scopes")(scopes_command)
