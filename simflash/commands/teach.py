"""Commands for learning the algorithm: `trace` (the online softmax, tile by tile), `verify` (the causal
skip bound and mask, checked against direct attention) and `scopes` (what lives on chip, at which scope).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import attrs
import numpy as np
import typer

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.api import flash_attention, run_tiled
from simflash.commands import JSON_HELP, print_json
from simflash.config import CAUSAL_VARIANTS, DEFAULT_GPU, KiB, STORAGE_DTYPES, check_positive_int, gpu_spec
from simflash.memory import SimulatedGPU
from simflash.numerics import reference_attention
from simflash.schedule import TileSchedule
from simflash.scopes import on_chip_scopes
from simflash.trace import TileStep

# The lesson's section 3.2: one query row, d = 2, two KV tiles of two keys each.
EXAMPLE_SCORES = ((8.0, 6.0), (10.0, 7.0))
EXAMPLE_VALUES = ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0))


@attrs.frozen
class TraceView:
    """How to read a variant's trace: its name, its accumulator's symbol, how O follows from the last step."""

    title: str
    symbol: str
    final: str
    output: Callable[[TileStep], np.ndarray]


def _divide_by_l(step: TileStep) -> np.ndarray:
    return np.divide(step.a, step.l[:, None], out=np.zeros_like(step.a), where=step.l[:, None] > 0)


TRACE_VIEWS = {
    "fa2": TraceView("FlashAttention-2", "a", "O = a / l, once, after the last tile", _divide_by_l),
    "fa1": TraceView("FlashAttention-1", "O_i", "O = O_i: normalised after every tile, no final division",
                     lambda step: step.a),
}


# ---------------------------------------------------------------------------------------------- text


def _num(x: float) -> str:
    return f"{x:.4f}" if np.isfinite(x) else ("-inf" if x < 0 else "inf")


def _vec(values: Sequence[float], limit: int = 6) -> str:
    shown = [_num(float(x)) for x in values[:limit]]
    return "[" + ", ".join(shown) + (", ..." if len(values) > limit else "") + "]"


def _size(nbytes: int) -> str:
    if nbytes < KiB:
        return f"{nbytes} B"
    return f"{nbytes // KiB} KiB" if nbytes % KiB == 0 else f"{nbytes / KiB:.2f} KiB"


def _changes(steps: Sequence[TileStep], row: int) -> list[str]:
    """What each step did to one row's state, read off the state itself."""
    notes, l_old = [], 0.0
    for step in steps:
        l_new, alpha = float(step.l[row]), float(step.alpha[row])
        if l_new == 0:
            notes.append("no visible key yet")
        elif l_old == 0:
            notes.append("first visible keys: the state starts")
        elif alpha < 1:
            notes.append("max moved: old state rescaled by alpha")
        else:
            notes.append("max unchanged (alpha = 1)")
        l_old = l_new
    return notes


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


def score_problem(scores: Sequence[Sequence[float]], values: Sequence[Sequence[float]]):
    """q, k, v (float64) whose scores with scale 1 are exactly `scores`: q = e_0, key c = (s_c, 0, ..., 0)."""
    flat = np.array([s for tile in scores for s in tile], dtype=np.float64)  # (n_kv,)
    v = np.array(values, dtype=np.float64)  # (n_kv, d)
    q = np.zeros((1, v.shape[1]))  # (1, d)
    q[0, 0] = 1.0
    k = np.zeros_like(v)  # (n_kv, d)
    k[:, 0] = flat
    return q, k, v


def _trace_scores(scores: list[list[float]], values: list[list[float]], variant: str) -> str:
    q, k, v = score_problem(scores, values)
    block_kv = len(scores[0])
    run = flash_attention(q, k, v, block_q=1, block_kv=block_kv, scale=1.0, dtype="float32", variant=variant,
                          trace="full")
    view = TRACE_VIEWS[variant]
    rows = []
    for step, change in zip(run.trace, _changes(run.trace, 0)):
        cols = slice(step.j * block_kv, step.j * block_kv + len(scores[step.j]))
        w = np.exp(k[cols, 0] - float(step.m[0]))  # this tile's weights on the new max
        rows.append([str(step.j + 1), _vec(k[cols, 0]), _num(step.m[0]), _num(step.alpha[0]), _vec(w),
                     _num(step.l[0]), _vec(step.a[0]), change])
    last = run.trace[-1]
    flat = k[:, 0]
    e = np.exp(flat - flat.max())  # float64, the whole row at once
    weights = e / e.sum()
    expected = weights @ v
    out = run.out[0].astype(np.float64)
    lines = [
        f"{view.title}, one query row, {len(scores)} KV tiles of {block_kv} keys, d = {v.shape[1]} "
        "(simulated: scale 1, float32, block_q 1, q = e_0, key c = (score_c, 0, ...))",
        "",
        _table(["tile", "scores", "m", "alpha", "w = exp(s - m)", "l", view.symbol, "what changed"], rows),
        "",
        f"final: {view.final}",
        f"  O = {_vec(view.output(last)[0])}",
        f"  O as stored in HBM: {_vec(out)}",
        "",
        "check against the softmax of the full row, in float64:",
        f"  scores {_vec(flat, limit=12)}",
        f"  weights {_vec(weights, limit=12)}",
        f"  weighted sum of the values {_vec(expected)}",
        f"  max |O - weighted sum| = {np.abs(out - expected).max():.2e}",
    ]
    return "\n".join(lines)


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


def _trace_random(n: int, n_kv: int, d: int, block_q: int, block_kv: int, causal: bool, causal_variant: str,
                  variant: str, dtype: str, rows_text: str, seed: int) -> str:
    for option, value in (("--n", n), ("--n-kv", n_kv), ("--d", d), ("--block-q", block_q), ("--block-kv", block_kv)):
        check_positive_int(option, value)
    rows = _parse_rows(rows_text, n)
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((n, d)), rng.standard_normal((n_kv, d)), rng.standard_normal((n_kv, d))
    run = flash_attention(q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, causal_variant=causal_variant,
                          dtype=dtype, variant=variant, trace="full", trace_tiles={r // block_q for r in rows})
    sched = TileSchedule(n, n_kv, block_q, block_kv, causal=causal, causal_variant=causal_variant)
    reference = reference_attention(q, k, v, causal, causal_variant, run.config.scale, dtype)  # (n, d) float64
    view = TRACE_VIEWS[variant]
    out = [
        f"{view.title}, n_q = {n}, n_kv = {n_kv}, d = {d}, block_q = {block_q}, block_kv = {block_kv}, "
        f"{dtype}, " + (f"causal ({causal_variant})" if causal else "not causal") + f", seed {seed}",
    ]
    for r in rows:
        i = r // block_q
        steps = run.trace.of_tile(i)
        local = r - sched.q_rows(i).start
        table = [[str(s.j), sched.tile_kind(i, s.j), _num(s.m[local]), _num(s.alpha[local]), _num(s.l[local]),
                  _vec(s.a[local]), change] for s, change in zip(steps, _changes(steps, local))]
        out += [
            "",
            f"query row {r} (query tile {i}, row {local} of it): {len(steps)} KV tiles visited",
            _table(["j", "kind", "m", "alpha", "l", view.symbol, "what changed"], table),
            f"final: {view.final}",
            f"  O[{r}] as stored in HBM: {_vec(run.out[r].astype(np.float64))}",
            f"  float64 reference:       {_vec(reference[r])}",
            f"  max |O - reference| = {np.abs(run.out[r].astype(np.float64) - reference[r]).max():.2e}",
        ]
    return "\n".join(out)


def trace_command(
    scores: Optional[str] = typer.Option(None, "--scores", help='Scores per KV tile: "8,6;10,7" (tiles split by ";").'),
    values: Optional[str] = typer.Option(None, "--values", help='One value row per key: "1,2;3,4;5,6;7,8".'),
    json_file: Optional[Path] = typer.Option(None, "--problem", help='A JSON file {"scores": [[...], ...], '
                                             '"values": [...]} (an input; --json is the output flag).'),
    n: Optional[int] = typer.Option(None, "--n", help="Random configuration: query rows (default 16)."),
    n_kv: Optional[int] = typer.Option(None, "--n-kv", help="Key rows (default: n)."),
    d: Optional[int] = typer.Option(None, "--d", help="Head dimension (default 4)."),
    block_q: Optional[int] = typer.Option(None, "--block-q", help="Query tile rows B_r (default 4)."),
    block_kv: Optional[int] = typer.Option(None, "--block-kv", help="KV tile rows B_c (default 2)."),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="Causal masking (default off)."),
    causal_variant: Optional[str] = typer.Option(None, "--causal-variant", help=f"One of {CAUSAL_VARIANTS}."),
    rows: Optional[str] = typer.Option(None, "--rows", help='Query rows to show: "0,5" (default: 0).'),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (default 0).", min=0),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=f"Storage dtype, one of {sorted(STORAGE_DTYPES)}."),
    variant: str = typer.Option("fa2", "--variant", help=f"One of {sorted(FLASH_ALGORITHMS)}."),
) -> None:
    """Watch the online softmax tile by tile: m, alpha, l and the accumulator after every KV tile.

    With no arguments: the two-tile worked example (scores [8, 6] then [10, 7]).

    --scores/--values or --problem: your own scores and values for one query row.

    --n, --d, --block-q, ...: a random problem, one table per chosen query row.
    """
    if variant not in FLASH_ALGORITHMS:
        raise typer.BadParameter(f"must be one of {sorted(FLASH_ALGORITHMS)}, got {variant!r}", param_hint="--variant")
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
    if json_file is not None:
        score_tiles, value_rows = _load_json(json_file)
        _check_problem(score_tiles, value_rows, "--problem")
        typer.echo(_trace_scores(score_tiles, value_rows, variant))
    elif scores is not None:
        score_tiles = _parse_matrix(scores, "--scores", 'scores per KV tile, "8,6;10,7"')
        value_rows = _parse_matrix(values, "--values", 'one row of numbers per key, "1,2;3,4;5,6;7,8"')
        _check_problem(score_tiles, value_rows, "--scores/--values")
        typer.echo(_trace_scores(score_tiles, value_rows, variant))
    elif random_given:
        size = 16 if n is None else n
        typer.echo(_trace_random(
            size, size if n_kv is None else n_kv, 4 if d is None else d, 4 if block_q is None else block_q,
            2 if block_kv is None else block_kv, bool(causal), causal_variant or "upper_left", variant,
            dtype or "float16", rows or "0", 0 if seed is None else seed,
        ))
    else:
        typer.echo(_trace_scores([list(t) for t in EXAMPLE_SCORES], [list(r) for r in EXAMPLE_VALUES], variant))


# ---------------------------------------------------------------------------------------- verify


@attrs.frozen
class Check:
    name: str
    passed: bool
    detail: str


@attrs.frozen
class NoMaskSchedule(TileSchedule):
    """The skip bound without the mask: the same tiles are visited, but every row sees every loaded key."""

    def mask(self, i: int, j: int) -> np.ndarray:
        rows, cols = self.q_rows(i), self.kv_cols(j)
        return np.ones((rows.stop - rows.start, cols.stop - cols.start), dtype=bool)


def run_algorithm(variant: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray, sched: TileSchedule,
                  scale: float) -> np.ndarray:
    """Run a registered algorithm on a fresh simulated GPU with this schedule; the O it leaves in HBM."""
    gpu = SimulatedGPU.build(sram_bytes=gpu_spec(DEFAULT_GPU).smem_carveout_bytes)
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        gpu.hbm.place(name, x[None], x.dtype)
    gpu.hbm.allocate("O", (1, *Q.shape), Q.dtype)
    for _ in run_tiled(gpu, variant, sched, scale):
        pass
    return gpu.hbm.inspect("O")[0]


# Small causal problems with diagonal tiles: (n_q, n_kv, causal_variant), at d = 8, B_r = 4, B_c = 2.
CAUSAL_PROBLEMS = ((16, 16, "upper_left"), (12, 16, "lower_right"))


def causal_checks(seed: int = 0, d: int = 8, block_q: int = 4, block_kv: int = 2,
                  tolerance: float = 1e-5) -> list[Check]:
    """Masked tiled attention equals direct masked attention; dropping the mask (skip bound kept) does not."""
    rng = np.random.default_rng(seed)
    checks = []
    for n_q, n_kv, causal_variant in CAUSAL_PROBLEMS:
        Q = rng.standard_normal((n_q, d)).astype(np.float32)  # (n_q, d)
        K, V = (rng.standard_normal((n_kv, d)).astype(np.float32) for _ in range(2))  # (n_kv, d)
        scale = 1.0 / np.sqrt(d)
        sched = TileSchedule(n_q, n_kv, block_q, block_kv, causal=True, causal_variant=causal_variant)
        kinds = sched.kind_map()
        reference = reference_attention(Q, K, V, True, causal_variant, scale, "float32")  # (n_q, d) float64
        # Rows that the skip bound lets see a future key: only the mask removes it.
        last_tile = np.array([(sched.kv_tiles(r // block_q) or [-1])[-1] for r in range(n_q)])
        last_loaded_col = np.minimum((last_tile + 1) * block_kv, n_kv) - 1
        sees_future = last_loaded_col > np.arange(n_q) + sched.diagonal_offset
        problem = (f"{n_q} x {n_kv}, B_r = {block_q}, B_c = {block_kv}, {causal_variant}: "
                   f"{np.sum(kinds == 'full')} full, {np.sum(kinds == 'masked')} masked (diagonal), "
                   f"{np.sum(kinds == 'skipped')} skipped tiles")
        for variant in FLASH_ALGORITHMS:
            error = np.abs(run_algorithm(variant, Q, K, V, sched, scale) - reference).max()
            checks.append(Check(
                f"{variant} causal, {problem}",
                bool(error <= tolerance and np.any(kinds == "masked")),
                f"max |O - direct masked attention (float64)| = {error:.1e} (tolerance {tolerance:g})",
            ))
            unmasked = NoMaskSchedule(n_q, n_kv, block_q, block_kv, causal=True, causal_variant=causal_variant)
            wrong = np.abs(run_algorithm(variant, Q, K, V, unmasked, scale) - reference).max(axis=1)  # (n_q,)
            differs = wrong > tolerance
            checks.append(Check(
                f"{variant} without the mask, skip bound kept, {n_q} x {n_kv} {causal_variant}",
                bool(np.any(differs) and np.array_equal(differs, sees_future)),
                f"{np.sum(differs)} of {n_q} rows differ from direct masked attention (by up to {wrong.max():.3f}): "
                f"exactly the {np.sum(sees_future)} rows whose loaded tiles hold keys in their future",
            ))
    return checks


def exercise4_checks() -> list[Check]:
    """The lesson's exercise 4, asked of TileSchedule: B_r = 128, B_c = 64, N = 4096, causal, query tile i = 5."""
    n, block_q, block_kv, lesson_tile = 4096, 128, 64, 5
    sched = TileSchedule(n, n, block_q, block_kv, causal=True)
    i = lesson_tile - 1  # the lesson counts tiles from 1
    rows = sched.q_rows(i)
    kinds = [sched.tile_kind(i, j) for j in range(sched.n_kv_tiles)]
    # Element-level truth: a tile is full if the mask permits all of it, skipped if none, masked otherwise.
    derived = ["full" if m.all() else "masked" if m.any() else "skipped"
               for m in (sched.mask(i, j) for j in range(sched.n_kv_tiles))]
    loads = sched.kv_tiles(i)
    full = [j + 1 for j in loads if kinds[j] == "full"]
    masked = [j + 1 for j in loads if kinds[j] == "masked"]
    half = block_q // 2
    last = sched.mask(i, loads[-1])
    second_last = sched.mask(i, loads[-2])
    return [
        Check(
            f"exercise 4: query tile i = {lesson_tile} (0-based {i}, rows {rows.start + 1}-{rows.stop}), "
            f"B_r = {block_q}, B_c = {block_kv}, N = {n}, causal",
            loads == list(range(2 * lesson_tile)) and kinds == derived,
            f"loads j = {loads[0] + 1}..{loads[-1] + 1} (skip bound j <= 2i = {2 * lesson_tile}); "
            f"j = {full[0]}..{full[-1]} full, j = {', '.join(map(str, masked))} masked; "
            "tile kinds agree with the element mask",
        ),
        Check(
            f"exercise 4: the upper {half} rows of tile {lesson_tile} see nothing of j = {loads[-1] + 1}",
            bool(not last[:half].any() and last[half:].any() and second_last[half:].all()
                 and not second_last[:half].all()),
            f"j = {loads[-1] + 1} is loaded but permits 0 entries in rows {rows.start + 1}-{rows.start + half}; "
            f"j = {loads[-2] + 1} is fully permitted for rows {rows.start + half + 1}-{rows.stop} and "
            f"triangular for rows {rows.start + 1}-{rows.start + half}",
        ),
    ]


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
    n_kv: Optional[int] = typer.Option(None, "--n-kv",
                                       help="Key rows (default kv_stages x B_c: no scope depends on it)."),
    kv_stages: int = typer.Option(2, "--kv-stages", help="K_j, V_j buffers in shared memory: 2 (the kernel's) or 1."),
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="GPU whose shared memory and register file bound the tiles."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """What lives on chip: shared memory and registers per query tile, and the scopes of the statistics."""
    report = on_chip_scopes(n, d, block_q, block_kv, dtype, n_kv=n_kv, kv_stages=kv_stages, gpu=gpu)
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
        f"registers per query tile, float32; P_ij overwrites S_ij "
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
