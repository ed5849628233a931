"""Roofline: the arithmetic intensity of attention against each GPU's ridge point.

FLOPs are the two matmuls over the visible score entries, 4 N^2 d per head unmasked (the roofline
lecture's `attention_flops`; softmax's O(N^2) elementwise work is left out, as there). Bytes come
from the closed-form traffic model under three intensity models, each describing one memory level:

- naive: the three-kernel baseline; S and P round-trip through DRAM (HBM).
- fa_compulsory: Q, K, V read once and O written once (the lecture's `flash_attention_bytes`):
  roughly what DRAM sees when the K/V re-reads of later query tiles hit in L2.
- fa_tiled: the tiled logical model, K/V re-read per query tile (the FlashAttention lesson's
  66 MiB): roughly what L2 serves to the SMs.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import attrs

from simflash.config import GPUS, GPUSpec, check_positive_int, gpu_spec, storage_dtype
from simflash.memory import Traffic
from simflash.model.traffic import FLASH_TRAFFIC, flash_traffic, naive_traffic, permitted_entries

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Bandwidth of each memory level, from the spec table. L2 figures are estimates (no vendor publishes one).
MEMORY_LEVELS: dict[str, Callable[[GPUSpec], float]] = {
    "HBM": lambda spec: spec.hbm_bytes_per_s,
    "L2": lambda spec: spec.l2_bytes_per_s,
}
ESTIMATED_LEVELS = frozenset({"L2"})

SWEEP_N = tuple(2**k for k in range(8, 16))  # 256 .. 32768, the lecture's sweep
PLOT_N = (1024, 4096, 16384)  # the lecture's markers
PLOT_SUFFIXES = (".png", ".svg")


def attention_flops(n: int, d: int, causal: bool = False, *, heads: int = 1) -> int:
    """FLOPs of S = Q K^T and O = P V over the visible entries: 4 N^2 d per head unmasked."""
    n, d, heads = (check_positive_int(name, v) for name, v in (("n", n), ("d", d), ("heads", heads)))
    return 4 * d * permitted_entries(n, n, bool(causal)) * heads


def compulsory_flash_traffic(n: int, d: int, dtype: str = "float16") -> Traffic:
    """Q, K, V read once and O written once: the tiled model with a single query tile of all N rows."""
    n = check_positive_int("n", n)
    return flash_traffic(n, d, block_q=n, block_kv=n, dtype=dtype)


@attrs.frozen
class IntensityModel:
    """One way of counting attention's bytes, and the memory level that count describes."""

    label: str
    level: str
    describes: str
    traffic: Callable[[int, int, str, int, int, str], Traffic]  # (n, d, dtype, B_r, B_c, variant)


INTENSITY_MODELS: dict[str, IntensityModel] = {
    "naive": IntensityModel(
        "naive", "HBM", "S and P written to and read back from DRAM (three kernels)",
        lambda n, d, dtype, block_q, block_kv, variant: naive_traffic(n, d, dtype),
    ),
    "fa_compulsory": IntensityModel(
        "FA compulsory", "HBM", "Q, K, V, O once: what DRAM sees when K/V re-reads hit in L2",
        lambda n, d, dtype, block_q, block_kv, variant: compulsory_flash_traffic(n, d, dtype),
    ),
    "fa_tiled": IntensityModel(
        "FA tiled logical", "L2", "K/V re-read per query tile: what L2 serves to the SMs",
        lambda n, d, dtype, block_q, block_kv, variant: flash_traffic(
            n, d, block_q=block_q, block_kv=block_kv, dtype=dtype, variant=variant),
    ),
}


@attrs.frozen
class IntensityRow:
    """One (N, d) point: FLOPs and the bytes of every intensity model."""

    n: int
    d: int
    dtype: str
    flops: int
    bytes_by_model: dict[str, int]

    def intensity(self, model: str) -> float:
        """FLOP per byte under `model`."""
        return self.flops / self.bytes_by_model[model]


def intensity_row(
    n: int, d: int, dtype: str = "float16", block_q: int = 128, block_kv: int = 64, variant: str = "fa2",
) -> IntensityRow:
    """FLOPs and bytes of one unmasked attention head under each model in INTENSITY_MODELS."""
    if variant not in FLASH_TRAFFIC:
        raise ValueError(f"variant must be one of {sorted(FLASH_TRAFFIC)}, got {variant!r}")
    return IntensityRow(n, d, dtype, attention_flops(n, d), {
        name: model.traffic(n, d, dtype, block_q, block_kv, variant).total_bytes
        for name, model in INTENSITY_MODELS.items()
    })


def intensity_table(
    ns: Iterable[int] = SWEEP_N, ds: Iterable[int] = (64, 128, 256), dtype: str = "float16",
    block_q: int = 128, block_kv: int = 64, variant: str = "fa2",
) -> list[IntensityRow]:
    """The lecture's table: rows ordered by d, then N."""
    ds, ns = positive_ints("ds", ds), positive_ints("ns", ns)
    return [intensity_row(n, d, dtype, block_q, block_kv, variant) for d in ds for n in ns]


@attrs.frozen
class Roof:
    """A GPU's roofline for one dtype: the compute peak and the bandwidth of each memory level."""

    gpu: str
    name: str
    dtype: str
    peak_flops: float  # FLOP/s
    bytes_per_s: dict[str, float]  # by memory level

    def ridge(self, level: str = "HBM") -> float:
        """FLOP per byte at which `level`'s bandwidth roof meets the compute roof."""
        return self.peak_flops / self.bytes_per_s[level]

    def attainable_flops(self, intensity: float, level: str = "HBM") -> float:
        """min(peak, I x bandwidth): the most FLOP/s a kernel of this intensity can reach."""
        return min(self.peak_flops, intensity * self.bytes_per_s[level])


def roof(gpu: str = "H200", dtype: str = "float16") -> Roof:
    spec = gpu_spec(gpu)
    storage_dtype(dtype)
    return Roof(gpu, spec.name, dtype, spec.peak_flops[dtype],
                {level: bandwidth(spec) for level, bandwidth in MEMORY_LEVELS.items()})


def gpu_roofs(dtype: str = "float16") -> list[Roof]:
    """Every GPU in the spec table, in table order."""
    return [roof(gpu, dtype) for gpu in GPUS]


def crossing(points: Sequence[tuple[int, float]], ridge: float) -> str:
    """Where a sweep of (N, intensity) lies against a ridge, in words."""
    above = [intensity >= ridge for _, intensity in points]
    flips = [points[k][0] for k in range(1, len(points)) if above[k] != above[k - 1]]
    if not flips:
        return f"stays {'above' if above[0] else 'below'} the ridge across the entire sweep"
    if len(flips) == 1:
        return f"crosses {'above' if above[-1] else 'below'} the ridge at N={flips[0]}"
    return f"crosses the ridge at N={', '.join(map(str, flips))}"


def crossings_by_d(rows: Sequence[IntensityRow], model: str, ridge: float) -> str:
    """Clauses like 'at d=64, 128 stays below the ridge ...', d values grouped by behaviour."""
    by_phrase: dict[str, list[int]] = {}
    for d in dict.fromkeys(row.d for row in rows):
        points = [(row.n, row.intensity(model)) for row in rows if row.d == d]
        by_phrase.setdefault(crossing(points, ridge), []).append(d)
    return "; ".join(f"at d={', '.join(map(str, ds))} {phrase}" for phrase, ds in by_phrase.items())


def conclusion(rows: Sequence[IntensityRow], gpu_roof: Roof) -> str:
    """The lecture's two-sentence "Ship it" conclusion, generated from the numbers."""
    if any(row.dtype != gpu_roof.dtype for row in rows):
        raise ValueError(f"rows must be computed in the roof's dtype {gpu_roof.dtype!r}")
    hbm, l2 = gpu_roof.ridge("HBM"), gpu_roof.ridge("L2")
    ns = sorted({row.n for row in rows})
    naive_peak = max(rows, key=lambda row: row.intensity("naive"))
    first = (
        f"On {gpu_roof.name} ({gpu_roof.dtype}, HBM ridge {hbm:.0f} FLOP/byte), naive attention "
        f"{crossings_by_d(rows, 'naive', hbm)} (N={ns[0]}..{ns[-1]}; its highest intensity is "
        f"{naive_peak.intensity('naive'):.1f} FLOP/byte, at d={naive_peak.d}, N={naive_peak.n})."
    )
    second = (
        f"FlashAttention by compulsory traffic (DRAM) {crossings_by_d(rows, 'fa_compulsory', hbm)}, "
        f"and by tiled logical traffic (L2, estimated L2 ridge {l2:.0f} FLOP/byte) "
        f"{crossings_by_d(rows, 'fa_tiled', l2)}."
    )
    return f"{first} {second}"


# -- The roofline lecture read two ways: its text against its own code (issue 11, item 8)

# The lecture's GPU table as its code writes it (`GPUS`: name -> (peak bf16 FLOP/s, HBM bytes/s)):
# inputs quoted from the document, as QUOTED_FLOP_SHARE is in amdahl.py, so its ridges can be computed.
LECTURE_GPUS: dict[str, tuple[float, float]] = {"A100": (312e12, 2.0e12), "H100": (989e12, 3.35e12),
                                               "H200": (989e12, 4.8e12)}
LECTURE_DTYPE = "bfloat16"  # the lecture's head_dim=..., dtype=bf16


@attrs.frozen
class Reading:
    """One of a document's two readings of the same quantity: where it comes from and its value."""

    source: str  # e.g. "lecture text", "lecture code", "spec table"
    how: str  # how the value is obtained
    value: float


@attrs.frozen
class TwoReadings:
    """A quantity the documents state two ways, both computed, with a note saying which simflash uses."""

    quantity: str
    readings: tuple[Reading, Reading]
    note: str


def _tb(bytes_per_s: float) -> str:
    """TB/s as the documents write them: 2.0, 2.039, 3.35."""
    text = f"{bytes_per_s / 1e12:g}"
    return text if "." in text else f"{text}.0"


def naive_intensity_readings(d: int, n: int = SWEEP_N[-1], dtype: str = LECTURE_DTYPE) -> TwoReadings:
    """Naive attention's intensity as the lecture's text reads it (4 N^2 d FLOPs over one pass of an
    N x N matrix, = 4 d / itemsize: 128 at d = 64 in bf16) and as its code counts it
    (`naive_attention_bytes`: S written, P read and written, P read again, plus Q, K, V, O: about d / 2)."""
    d, n = check_positive_int("d", d), check_positive_int("n", n)
    itemsize = storage_dtype(dtype).itemsize
    flops = attention_flops(n, d)
    text = Reading("lecture text", f"4 N^2 d / (N^2 x {itemsize} B): one pass over one N x N matrix",
                   flops / (n * n * itemsize))
    code = Reading("lecture code", f"naive_attention_bytes: 4 passes over N x N (S w, P r+w, P r) + Q, K, V, O; N={n}",
                   intensity_row(n, d, dtype).intensity("naive"))
    ratio = text.value / code.value
    note = (f"d={d}: the text's I = {text.value:.1f} divides the FLOPs by one N x N matrix in {dtype}; the code "
            f"(and simflash) moves four, so I = {code.value:.1f}, {ratio:.2f}x lower (about d/2 = {d / 2:g}). "
            f"simflash's tables use the code's count.")
    return TwoReadings(f"naive I at d={d}", (text, code), note)


def lecture_ridge_readings(gpu: str) -> TwoReadings | None:
    """A GPU's ridge from the lecture's (peak, bandwidth) and from simflash's spec table (the lesson's
    sources), in the lecture's bf16; None when the two use the same figures or the lecture omits the GPU."""
    if gpu not in LECTURE_GPUS:
        return None
    peak, bandwidth = LECTURE_GPUS[gpu]
    spec = roof(gpu, LECTURE_DTYPE)
    if (peak, bandwidth) == (spec.peak_flops, spec.bytes_per_s["HBM"]):
        return None
    lecture = Reading("lecture table and code", f"{peak / 1e12:g} TFLOP/s / {_tb(bandwidth)} TB/s",
                      peak / bandwidth)
    table = Reading("spec table (the lesson's sources)",
                    f"{spec.peak_flops / 1e12:g} TFLOP/s / {_tb(spec.bytes_per_s['HBM'])} TB/s", spec.ridge())
    note = (f"{spec.name}: the roofline lecture uses {_tb(bandwidth)} TB/s, the lesson and the datasheet "
            f"{_tb(spec.bytes_per_s['HBM'])} TB/s; ridge {lecture.value:.0f} vs {table.value:.0f} FLOP/byte. "
            f"simflash uses the spec table.")
    return TwoReadings(f"{gpu} HBM ridge ({LECTURE_DTYPE})", (lecture, table), note)


def lecture_readings(ds: Iterable[int] = (64, 128), n: int = SWEEP_N[-1],
                     dtype: str = LECTURE_DTYPE) -> list[TwoReadings]:
    """Every place the roofline lecture's text and code (or the lesson) disagree, both readings computed."""
    found = [naive_intensity_readings(d, n, dtype) for d in positive_ints("ds", ds)]
    return found + [r for r in (lecture_ridge_readings(gpu) for gpu in LECTURE_GPUS) if r is not None]


def verdicts(d: int, gpu_roof: Roof, n: int = SWEEP_N[-1]) -> str:
    """Where each reading of naive I at `d` lies against a GPU's HBM ridge, in words."""
    readings = naive_intensity_readings(d, n, gpu_roof.dtype).readings
    ridge = gpu_roof.ridge()
    return "; ".join(f"{r.source} I = {r.value:.1f} is {'below' if r.value < ridge else 'at or above'} "
                     f"{gpu_roof.name}'s ridge {ridge:.0f}" for r in readings)


def save_figure(fig: Figure, path: str | pathlib.Path) -> pathlib.Path:
    """Write a figure as PNG or SVG, chosen by the file suffix."""
    path = pathlib.Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"plot file must end in one of {PLOT_SUFFIXES}, got {str(path)!r}")
    fig.savefig(path, dpi=120)
    return path


def plot_roofline(
    path: str | pathlib.Path, gpu: str = "H200", d: int = 128, dtype: str = "float16",
    ns: Iterable[int] = PLOT_N, block_q: int = 128, block_kv: int = 64, variant: str = "fa2",
) -> pathlib.Path:
    """HBM and (estimated) L2 roofs with a marker per intensity model at each N, placed on its level's roof."""
    return save_figure(roofline_figure(gpu, d, dtype, ns, block_q, block_kv, variant), path)


def roofline_markers(
    gpu: str = "H200", d: int = 128, dtype: str = "float16", ns: Iterable[int] = PLOT_N,
    block_q: int = 128, block_kv: int = 64, variant: str = "fa2",
) -> list[tuple[str, int, float, float]]:
    """The plot's markers: (intensity model, N, intensity in FLOP/byte, attainable TFLOP/s on its roof)."""
    gpu_roof = roof(gpu, dtype)
    rows = [intensity_row(n, d, dtype, block_q, block_kv, variant) for n in positive_ints("ns", ns)]
    return [(name, row.n, row.intensity(name), gpu_roof.attainable_flops(row.intensity(name), model.level) / 1e12)
            for name, model in INTENSITY_MODELS.items() for row in rows]


def roofline_figure(
    gpu: str = "H200", d: int = 128, dtype: str = "float16", ns: Iterable[int] = PLOT_N,
    block_q: int = 128, block_kv: int = 64, variant: str = "fa2",
) -> Figure:
    """The roofline as a Figure (see plot_roofline). y in TFLOP/s. Every marker is labelled N=... through
    a leader line (the labels of one model fan out, so markers that nearly coincide keep their own
    label), and a table beside the plot lists each marker's intensity and attainable TFLOP/s."""
    from matplotlib.figure import Figure  # plotting only: keeps `import simflash` light
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    gpu_roof = roof(gpu, dtype)
    markers = roofline_markers(gpu, d, dtype, ns, block_q, block_kv, variant)
    intensities = [x for _, _, x, _ in markers]
    ridges = [gpu_roof.ridge(level) for level in MEMORY_LEVELS]
    lo, hi = min(intensities + ridges) / 4, max(intensities + ridges) * 4
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    peak = gpu_roof.peak_flops / 1e12

    fig = Figure(figsize=(11.5, 5.8), layout="constrained")
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": (3.2, 1)})
    for level, style in zip(MEMORY_LEVELS, ("-", "--")):
        estimate = " (estimate)" if level in ESTIMATED_LEVELS else ""
        label = (f"{level} roof, {gpu_roof.bytes_per_s[level] / 1e12:g} TB/s{estimate}, "
                 f"ridge {gpu_roof.ridge(level):.0f} FLOP/byte")
        ax.plot(grid, [gpu_roof.attainable_flops(i, level) / 1e12 for i in grid], style, color="black", label=label)
        ax.axvline(gpu_roof.ridge(level), color="grey", linestyle=":", linewidth=0.8)
    for c, ((name, model), marker) in enumerate(zip(INTENSITY_MODELS.items(), ("o", "s", "^"))):
        points = sorted((x, y, n) for m, n, x, y in markers if m == name)
        ax.scatter([x for x, _, _ in points], [y for _, y, _ in points], marker=marker, s=60, zorder=3,
                   facecolors="none", edgecolors=f"C{c}", linewidths=1.6, label=f"{model.label} ({model.level})")
        crowded = max(x for x, _, _ in points) < 1.5 * min(x for x, _, _ in points)
        for k, (x, y, n) in enumerate(points):
            # Markers apart: the label just below. Crowded markers: their labels fan out below-right,
            # one row each (the leftmost lowest, so the leader lines never cross), clear of the slopes.
            flat = y >= peak * (1 - 1e-9)
            # (Below the flat roof they start under the row of labels of markers that stand apart.)
            offset = ((45, -30) if flat else (18, -12)) if crowded else (0, -16)
            if crowded:
                offset = (offset[0] + 3 * k, offset[1] - 13 * (len(points) - 1 - k))
            ax.annotate(f"N={n:,}", (x, y), xytext=offset, textcoords="offset points", fontsize=7, color=f"C{c}",
                        ha="left" if crowded else "center", va="top",
                        arrowprops={"arrowstyle": "-", "color": f"C{c}", "linewidth": 0.6, "shrinkA": 0,
                                    "shrinkB": 4})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"{gpu_roof.name}, {dtype}, d={d}: attention on the roofline (peak {peak:g} TFLOP/s)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    side.axis("off")
    rows = [[INTENSITY_MODELS[m].label, f"{n:,}", f"{x:,.0f}", f"{y:,.0f}"] for m, n, x, y in markers]
    table = side.table(cellText=rows, colLabels=["model", "N", "FLOP/B", "TFLOP/s"], loc="upper center",
                       cellLoc="right", colLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.auto_set_column_width(range(4))
    side.set_title("the markers", fontsize=9)
    return fig


def positive_ints(name: str, values: Iterable[int]) -> list[int]:
    """A non-empty list of positive integers, or a ValueError naming the argument."""
    values = [check_positive_int(name, v) for v in values]
    if not values:
        raise ValueError(f"{name} must hold at least one positive integer")
    return values
