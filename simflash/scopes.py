"""What lives on chip, and at which scope: shared memory and registers per query tile, and the three
scopes of the softmax statistics (m, l over a whole head; m_i, l_i and a_i live in one CTA; the exported L).

Every number is read off a FlashAttention-2 run on the simulated GPU: the buffers its CTAs hold
(`run.events`), their peaks (`run.on_chip`) and the ledger (`run.traffic`). Shared memory holds Q_i and
kv_stages x (K_j, V_j); registers hold m_i, l_i, a_i and S_ij, float32, and P_ij over S_ij
(p_registers="overwrite_s", kernel versions 1 and 2) or beside it in the storage dtype ("own", version 3),
as the backend kernels do: the report equals the kernel's shared memory for the same tiles. None of these
scopes depends on the key length once every K/V stage has held a full tile, so the run uses kv_stages
KV tiles unless told otherwise: that keeps the lesson's N = 4096 instant without changing a byte.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from simflash.api import flash_attention
from simflash.config import DEFAULT_GPU, StorageDtypeName, check_positive_int
from simflash.memory import MemoryEvent
from simflash.onchip import DEFAULT_KV_STAGES, DEFAULT_P_REGISTERS, check_kv_stages, cta_threads, lesson_tile_sizes

SHARED = "shared memory"
REGISTERS = "registers"


@attrs.frozen
class TileOccupancy:
    """On-chip occupancy of the query tiles first..last (0-based), which all hold the same buffers."""

    first: int
    last: int
    buffer_bytes: Mapping[str, int]  # shared memory: largest size each buffer reached
    peak_bytes: int  # shared memory: most bytes live at once
    register_bytes: Mapping[str, int] = attrs.field(factory=dict)  # registers: largest size per buffer
    register_peak_bytes: int = 0  # registers: most bytes live at once


@attrs.frozen
class ScopesReport:
    n_q: int
    n_kv: int
    d: int
    block_q: int
    block_kv: int
    dtype: str
    kv_stages: int
    p_registers: str  # where P_ij waits for its P V product (simflash.onchip)
    threads: int  # per CTA: one warp per 16 query rows, as the backend kernel launches it
    capacity_bytes: int  # the configured shared-memory carve-out
    register_capacity_bytes: int  # the CTA's share of the register file
    lesson_tiles: Mapping[str, int]  # the lesson's section 2 tile sizes, named as what they are
    tiles: tuple[TileOccupancy, ...]
    head_state_bytes: int  # m and l over every query row of one head (summed over its CTAs)
    cta_stats_bytes: int  # m_i and l_i held by one CTA
    cta_accumulator_bytes: int  # a_i held by one CTA
    logsumexp_bytes: int  # L = m + log l written to HBM, one head


def _cta_occupancy(events: list[MemoryEvent]) -> tuple[dict[str, int], int]:
    """Replay one CTA's shared-memory holds and releases: largest size per buffer, peak live bytes."""
    live: dict[str, int] = {}
    largest: dict[str, int] = {}
    peak = 0
    for event in events:
        if event.op == "hold":
            live[event.name] = event.nbytes
            largest[event.name] = max(largest.get(event.name, 0), event.nbytes)
            peak = max(peak, sum(live.values()))
        elif event.op == "release":
            del live[event.name]
    return largest, peak


def on_chip_scopes(
    n: int = 4096, d: int = 128, block_q: int = 128, block_kv: int = 64, dtype: StorageDtypeName = "float16", *,
    n_kv: int | None = None, gpu: str = DEFAULT_GPU, seed: int = 0, kv_stages: int = DEFAULT_KV_STAGES,
    p_registers: str = DEFAULT_P_REGISTERS,
) -> ScopesReport:
    """Run FlashAttention-2 on one head of random inputs and read the scopes off its buffers.

    n_kv defaults to kv_stages x block_kv (every K/V stage filled once): any n_kv >= that gives the same report.
    """
    n = check_positive_int("n", n)
    d = check_positive_int("d", d)
    block_kv = check_positive_int("block_kv", block_kv)
    kv_stages = check_kv_stages(kv_stages)
    n_kv = kv_stages * block_kv if n_kv is None else check_positive_int("n_kv", n_kv)
    # Every full query tile holds the same buffers; only a ragged last tile differs. Simulate one full tile
    # and the last (n_sim rows), then stand the first for all full ones: the report does not grow with n.
    block_q = check_positive_int("block_q", block_q)
    tiles = -(-n // block_q)
    n_sim = n if tiles <= 2 else block_q + (n - (tiles - 1) * block_q)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_sim, d))
    k = rng.standard_normal((n_kv, d))
    v = rng.standard_normal((n_kv, d))
    run = flash_attention(
        q, k, v, block_q=block_q, block_kv=block_kv, dtype=dtype, variant="fa2", trace="none",
        write_logsumexp=True, gpu=gpu, record_events=True, kv_stages=kv_stages, p_registers=p_registers,
    )

    by_cta: dict[tuple[int, ...], dict[str, list[MemoryEvent]]] = {}
    for event in run.events:
        if event.scope in (SHARED, REGISTERS):
            by_cta.setdefault(event.cta, {SHARED: [], REGISTERS: []})[event.scope].append(event)
    groups: list[TileOccupancy] = []
    spans = {0: (0, tiles - 2), 1: (tiles - 1, tiles - 1)} if n_sim < n else {}  # simulated tile -> real tiles
    for (_, i), events in sorted(by_cta.items()):
        first, last = spans.get(i, (i, i))
        tile = TileOccupancy(first, last, *_cta_occupancy(events[SHARED]), *_cta_occupancy(events[REGISTERS]))
        if groups and attrs.evolve(groups[-1], first=first, last=last) == tile:
            groups[-1] = attrs.evolve(groups[-1], last=last)
        else:
            groups.append(tile)

    on_chip = run.on_chip
    assert on_chip is not None  # fa2 measures its CTAs' occupancy
    registers = on_chip.registers.peak_by_buffer
    statistics = ("m_i", "l_i")
    state_by_tile: dict[int, int] = {}
    for e in run.events:
        if e.scope == REGISTERS and e.op == "hold" and e.name in statistics:
            state_by_tile[e.cta[1]] = state_by_tile.get(e.cta[1], 0) + e.nbytes
    head_state = sum(nbytes * (spans.get(i, (i, i))[1] - spans.get(i, (i, i))[0] + 1)
                     for i, nbytes in state_by_tile.items())
    shared_capacity, register_capacity = on_chip.shared.capacity_bytes, on_chip.registers.capacity_bytes
    assert shared_capacity is not None and register_capacity is not None  # a fa2 CTA is held to both
    return ScopesReport(
        n_q=n, n_kv=n_kv, d=d, block_q=block_q, block_kv=block_kv, dtype=dtype,
        kv_stages=kv_stages, p_registers=p_registers, threads=cta_threads(min(block_q, n)),
        capacity_bytes=shared_capacity, register_capacity_bytes=register_capacity,
        lesson_tiles=lesson_tile_sizes(min(block_q, n), min(block_kv, n_kv), d, dtype),
        tiles=tuple(groups),
        head_state_bytes=head_state,
        cta_stats_bytes=sum(registers[name] for name in statistics),
        cta_accumulator_bytes=registers["a_i"],
        logsumexp_bytes=run.traffic.by_tensor["L"].write_bytes // n_sim * n,  # one float32 per query row
    )
