"""Traffic curves: HBM bytes against sequence length N and against SRAM capacity M.

Against N, every tiled variant in FLASH_TRAFFIC is compared with the naive baseline of the same
masking condition (unmasked with unmasked, causal with causal), never across conditions. Against
M, tile sizes follow FlashAttention-1's Algorithm 1 (B_c = ceil(M / 4d), B_r = min(ceil(M / 4d), d),
M in elements of the storage dtype), which makes the traffic Theta(N^2 d^2 / M) while B_r < d.
"""

from __future__ import annotations

import itertools
import math
import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from simflash.config import KiB, MiB, check_positive_int, storage_dtype
from simflash.model.roofline import SWEEP_N, positive_ints, save_figure
from simflash.model.traffic import FLASH_TRAFFIC, flash_traffic, idealized_causal_naive_traffic, naive_traffic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SWEEP_SRAM_BYTES = tuple(2**k * KiB for k in range(3, 9))  # 8 .. 256 KiB
CONDITIONS = (False, True)  # unmasked, causal: each its own experiment with its own baseline


def fa1_tile_sizes(m_elements: int, d: int) -> tuple[int, int]:
    """(B_r, B_c) for SRAM of M elements, as FA-1's Algorithm 1 sets them."""
    m_elements, d = check_positive_int("m_elements", m_elements), check_positive_int("d", d)
    b_c = -(-m_elements // (4 * d))
    return min(b_c, d), b_c


@attrs.frozen
class NPoint:
    """HBM traffic at one N under one masking condition, with the baseline of that same condition."""

    n: int
    causal: bool
    baseline_bytes: int  # naive three-kernel; causal: exactly the permitted entries of S and P
    idealized_baseline_bytes: int | None  # causal only: the lesson's triangle rounded to N^2 / 2
    bytes_by_variant: dict[str, int]

    def reduction(self, variant: str) -> float:
        """Baseline bytes over the variant's bytes, within this masking condition."""
        return self.baseline_bytes / self.bytes_by_variant[variant]


def traffic_vs_n(
    ns: Iterable[int] = SWEEP_N, d: int = 128, causal: bool = False, dtype: str = "float16",
    block_q: int = 128, block_kv: int = 64,
) -> list[NPoint]:
    """Naive and every registered tiled variant at each N, one masking condition."""
    return [
        NPoint(
            n, bool(causal), naive_traffic(n, d, dtype, causal=causal).total_bytes,
            idealized_causal_naive_traffic(n, d, dtype).total_bytes if causal else None,
            {variant: flash_traffic(n, d, block_q, block_kv, dtype, causal, variant).total_bytes
             for variant in FLASH_TRAFFIC},
        )
        for n in positive_ints("ns", ns)
    ]


@attrs.frozen
class MPoint:
    """HBM traffic at one SRAM capacity, with FA-1's tile sizes for it."""

    sram_bytes: int
    m_elements: int
    block_q: int  # B_r
    block_kv: int  # B_c
    n: int
    d: int
    itemsize: int
    baseline_bytes: int
    bytes_by_variant: dict[str, int]

    def scaled(self, variant: str) -> float:
        """Bytes over itemsize x N^2 d^2 / M: constant where the traffic is Theta(N^2 d^2 / M)."""
        return self.bytes_by_variant[variant] * self.m_elements / (self.itemsize * self.n**2 * self.d**2)


def traffic_vs_sram(
    sram_bytes: Iterable[int] = SWEEP_SRAM_BYTES, n: int = 4096, d: int = 128, causal: bool = False,
    dtype: str = "float16",
) -> list[MPoint]:
    """Every registered tiled variant at each SRAM capacity, tiles derived from M."""
    itemsize = storage_dtype(dtype).itemsize
    baseline = naive_traffic(n, d, dtype, causal=causal).total_bytes
    points = []
    for size in positive_ints("sram_bytes", sram_bytes):
        m = size // itemsize
        if m == 0:
            raise ValueError(f"sram_bytes must hold at least one {dtype} element, got {size}")
        block_q, block_kv = fa1_tile_sizes(m, d)
        points.append(MPoint(
            size, m, block_q, block_kv, n, d, itemsize, baseline,
            {variant: flash_traffic(n, d, block_q, block_kv, dtype, causal, variant).total_bytes
             for variant in FLASH_TRAFFIC},
        ))
    return points


def local_slopes(points: list[MPoint], variant: str) -> list[float | None]:
    """d log(bytes) / d log(M) between neighbouring points: -1 is the Theta(1/M) regime."""
    slopes: list[float | None] = [None]
    for a, b in itertools.pairwise(points):
        slopes.append(math.log(b.bytes_by_variant[variant] / a.bytes_by_variant[variant])
                      / math.log(b.m_elements / a.m_elements))
    return slopes


def plot_sweep(
    path: str | pathlib.Path, ns: Iterable[int] = SWEEP_N, sram_bytes: Iterable[int] = SWEEP_SRAM_BYTES,
    d: int = 128, dtype: str = "float16", block_q: int = 128, block_kv: int = 64, n_for_sram: int = 4096,
) -> pathlib.Path:
    """Three panels: traffic vs N unmasked, vs N causal (each with its own baseline), vs M."""
    return save_figure(sweep_figure(ns, sram_bytes, d, dtype, block_q, block_kv, n_for_sram), path)


def sweep_figure(
    ns: Iterable[int] = SWEEP_N, sram_bytes: Iterable[int] = SWEEP_SRAM_BYTES, d: int = 128,
    dtype: str = "float16", block_q: int = 128, block_kv: int = 64, n_for_sram: int = 4096,
) -> Figure:
    """The sweep as a Figure (see plot_sweep). The causal panel draws both naive baselines, each
    labelled: the exact causal triangle (the one the reductions are against) and the idealised N^2/2.
    M is in KiB, as the command's --sram-kib option (the title gives the elements it holds)."""
    from matplotlib.figure import Figure  # plotting only: keeps `import simflash` light
    from matplotlib.ticker import FuncFormatter

    ns, sram_bytes = list(ns), list(sram_bytes)
    fig = Figure(figsize=(15, 4.8))
    axes = fig.subplots(1, 3)
    for ax, causal in zip(axes, CONDITIONS):
        points = traffic_vs_n(ns, d, causal, dtype, block_q, block_kv)
        xs = [p.n for p in points]
        baseline = "naive causal, exact triangle (matched baseline)" if causal else "naive (matched baseline)"
        ax.plot(xs, [p.baseline_bytes / MiB for p in points], "o-", color="black", label=baseline)
        if causal:
            idealized = [p.idealized_baseline_bytes for p in points if p.idealized_baseline_bytes is not None]
            ax.plot(xs, [b / MiB for b in idealized], "o--", color="grey", mfc="none",
                    label="naive causal, idealized N²/2")
        for variant in FLASH_TRAFFIC:
            ax.plot(xs, [p.bytes_by_variant[variant] / MiB for p in points], "s-", label=variant)
        ax.set_title(f"{'causal' if causal else 'unmasked'}: B_r={block_q}, B_c={block_kv}, d={d}, {dtype}")
        ax.set_xlabel("sequence length N")

    m_points = traffic_vs_sram(sram_bytes, n_for_sram, d, False, dtype)
    kib = [p.sram_bytes / KiB for p in m_points]
    ax = axes[2]
    ax.plot(kib, [p.baseline_bytes / MiB for p in m_points], "o-", color="black", label="naive (no tiles)")
    for variant in FLASH_TRAFFIC:
        ax.plot(kib, [p.bytes_by_variant[variant] / MiB for p in m_points], "s-", label=variant)
    # The Theta(N^2 d^2 / M) reference, anchored at the first point of the first variant.
    first = next(iter(FLASH_TRAFFIC))
    anchor = m_points[0].bytes_by_variant[first] / MiB * kib[0]
    ax.plot(kib, [anchor / m for m in kib], ":", color="grey", label="∝ N²d²/M")
    itemsize = storage_dtype(dtype).itemsize
    ax.set_title(f"unmasked, N={n_for_sram}, d={d}: tiles from M (FA-1 Alg. 1)\n"
                 f"M elements = KiB x {KiB // itemsize} ({dtype})", fontsize=10)
    ax.set_xlabel("SRAM capacity M (KiB)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylabel("HBM traffic (MiB)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[2].xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    fig.tight_layout()
    return fig
