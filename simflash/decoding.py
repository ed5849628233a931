"""Flash-Decoding on the simulated GPU: attention for the few new query rows of a decode step against a
long KV cache, split along the keys so that every SM has work, then combined with a logsumexp.

Two kernels run, each a grid of CTAs driven by the grid runner like FA-2's:
simflash.algorithms.flash_decoding_split (FA-2's online softmax over one split's run of KV tiles,
writing partial outputs and logsumexps) and simflash.algorithms.flash_decoding_combine (the
logsumexp merge). The split count, tiles and grid are FlashAttention-2's (simflash.model.decode).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import attrs
import numpy as np

from simflash.algorithms.flash_decoding_combine import KERNEL as COMBINE_KERNEL
from simflash.algorithms.flash_decoding_combine import combine_cta, combine_grid
from simflash.algorithms.flash_decoding_split import KERNEL as SPLIT_KERNEL
from simflash.algorithms.flash_decoding_split import split_cta, split_grid
from simflash.api import Run, RunConfig, _simulated_gpu, _trace_config, pack_heads, prepare_inputs, unpack_heads
from simflash.config import DEFAULT_GPU, STATE_DTYPE, MiB, StorageDtypeName, check_bool, gpu_spec
from simflash.grid import CTA, run_bodies
from simflash.model.decode import decode_launch
from simflash.onchip import DEFAULT_KV_STAGES, check_fits, cta_resources
from simflash.schedule import SplitSchedule, check_cache_seqlens
from simflash.trace import DEFAULT_TRACE_BUDGET_BYTES, TRACE_LEVELS, Trace, TraceLevel, TraceRequest

ALGORITHM = "flash_decoding"


def flash_decoding(
    q, k, v, num_splits: int | None = None, block_kv: int | None = None, *, pack_gqa: bool = True,
    cache_seqlens: Sequence[int] | None = None, causal: bool = False, window: tuple[int, int] = (-1, -1),
    scale: float | None = None, dtype: StorageDtypeName = "float16", trace: TraceLevel = "none",
    gpu: str = DEFAULT_GPU,
) -> Run:
    """Split-KV attention (Flash-Decoding) on the simulated GPU. q: (batch, H_q, n_q, d), usually n_q = 1,
    or (H_q, n_q, d) for batch 1; k, v: (batch, H_kv, n_kv, d) (or (H_kv, n_kv, d)), H_q a multiple of
    H_kv: query head h reads K/V head h // (H_q / H_kv).

    num_splits: runs of whole KV tiles each query tile's keys are cut into, ceil(T_c / num_splits) tiles
    each (T_c from the allocated n_kv), 1..T_c; None picks FlashAttention-2's num_splits_heuristic (see
    simflash.model.decode). block_kv: KV tile rows (None: FA-2's by head dim: 256 for d <= 64, 128 for
    d <= 128, 64 above); query tiles are FA-2's 64 rows. pack_gqa: a K/V head's group of query heads packed
    into the rows of one query tile (packed row r x group + h), so each K/V tile is read once per group.
    cache_seqlens: each batch element's valid K/V rows (1..n_kv; None: all n_kv); rows past it are never
    read. Causal and window (left, right) are aligned bottom-right to each element's cache length: query
    row r is position seqlen_b - n_q + r.

    With one split the split kernel writes O directly; otherwise it writes float32 partials (O_partial,
    LSE_partial) that the combine kernel merges into O. `run.decode` reports the split count, CTAs and
    waves; trace="stats" or "full" records each split's online-softmax steps (TileStep.split) and the
    combine's weights (run.trace.combine_weights, (splits, rows) with rows in the output's order:
    query head over the batch x n_q + position).
    """
    q_dims = np.ndim(q)
    if q_dims not in (3, 4):
        raise ValueError(f"q must have shape (batch, H_q, n_q, d) or (H_q, n_q, d), got shape {np.shape(q)}")
    causal = check_bool("causal", causal)
    pack_gqa = check_bool("pack_gqa", pack_gqa)
    if trace not in TRACE_LEVELS:
        raise ValueError(f"trace must be one of {TRACE_LEVELS}, got {trace!r}")
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, "lower_right")
    heads, n_q, d = Q.shape
    kv_heads, n_kv = K.shape[:2]
    batch = np.shape(q)[0] if q_dims == 4 else 1
    group = heads // kv_heads
    seqlens = check_cache_seqlens(cache_seqlens, batch, n_kv)
    launch = decode_launch(n_kv, d, batch=batch, heads=heads // batch, kv_heads=kv_heads // batch, n_q=n_q,
                           num_splits=num_splits, block_kv=block_kv, pack_gqa=pack_gqa, dtype=dtype, gpu=gpu)
    pack = group if pack_gqa else 1
    sched = SplitSchedule(n_q, n_kv, launch.block_q, launch.block_kv, launch.num_splits, seqlens, causal, window,
                          pack)
    config = RunConfig(ALGORITHM, heads, n_q, n_kv, d, dtype, scale, causal, "lower_right", launch.block_q,
                       launch.block_kv, gpu=gpu, window=window, kv_heads=kv_heads if group > 1 else None,
                       pack_gqa=pack_gqa, num_splits=launch.num_splits,
                       cache_seqlens=None if cache_seqlens is None else seqlens)
    _check_trace_budget(trace, sched, d, (kv_heads if pack_gqa else heads) // batch)

    tile_rows = min(launch.block_q, n_q * pack)
    machine, capacity = _simulated_gpu(gpu, None, False, None, tile_rows)
    check_fits(cta_resources(tile_rows, min(launch.block_kv, n_kv), d, dtype, DEFAULT_KV_STAGES), gpu_spec(gpu),
               capacity)
    config = attrs.evolve(config, sram_bytes=capacity)
    if pack_gqa:
        Q = pack_heads(Q, group)
    hbm = machine.hbm
    hbm.place("Q", Q, Q.dtype)
    hbm.place("K", K, K.dtype)
    hbm.place("V", V, V.dtype)
    rows = Q.shape[0] * Q.shape[1]  # every (batch-head, packed row): the layout of O and of the partials
    hbm.allocate("O", (rows, d), Q.dtype)
    if launch.num_splits > 1:
        hbm.allocate("O_partial", (launch.num_splits, rows, d), STATE_DTYPE)
        hbm.allocate("LSE_partial", (launch.num_splits, rows), STATE_DTYPE)
    request = TraceRequest(trace)

    # -- kernel 1: every (query tile, split, batch-head) CTA, in launch order
    heads_per_batch = Q.shape[0] // batch
    with hbm.kernel(SPLIT_KERNEL):
        def split_body(cta: CTA) -> Iterator:  # a CTA's view is made when it starts
            return split_cta(machine.for_cta(cta.index), sched, scale, request, cta, heads_per_batch)

        steps = tuple(run_bodies({cta: functools.partial(split_body, cta)
                                  for cta in split_grid(sched, heads_per_batch, group // pack)}, 1))

    # -- kernel 2: merge the splits, row by row
    weights = None
    if launch.num_splits > 1:
        record = trace != "none"
        with hbm.kernel(COMBINE_KERNEL):
            def combine_body(cta: CTA) -> Iterator:
                return combine_cta(machine.for_cta(cta.index), launch.combine_block_rows, cta, record)

            records = list(run_bodies({cta: functools.partial(combine_body, cta)
                                       for cta in combine_grid(rows, launch.combine_block_rows, launch.num_splits)},
                                      1))
        if record:
            weights = np.empty((launch.num_splits, rows), dtype=STATE_DTYPE)
            for cta_weights in records:
                weights[:, cta_weights.row_start:cta_weights.row_start + cta_weights.weights.shape[1]] = \
                    cta_weights.weights
            by_row = _unpacked(weights.reshape(launch.num_splits, *Q.shape[:2]).transpose(1, 2, 0), pack)
            weights = by_row.transpose(2, 0, 1).reshape(launch.num_splits, heads * n_q)  # (splits, query rows)

    out = _unpacked(hbm.inspect("O").reshape(Q.shape), pack)
    return Run(
        out=out.reshape(np.shape(q)),
        traffic=hbm.traffic(),
        flops=machine.compute.flops,
        trace=Trace(trace, steps, _trace_config(config), weights),
        config=config,
        on_chip=machine.on_chip_statistics(),
        flops_by_kind=machine.compute.flops_by_kind(),
        decode=launch,
    )


def _unpacked(x: np.ndarray, pack: int) -> np.ndarray:
    """(batch-heads, packed rows, ...) back to (query heads, rows, ...)."""
    return unpack_heads(x, pack) if pack > 1 else x


def _check_trace_budget(level: str, sched: SplitSchedule, d: int, heads_per_batch: int) -> None:
    """Refuse a trace whose steps would outgrow DEFAULT_TRACE_BUDGET_BYTES (the splits of a query tile's
    run hold its tiles once between them, so the steps are FA-2's, batch element by batch element)."""
    if level == "none":
        return
    rows = 0
    for b in range(len(sched.cache_seqlens)):
        tiling = sched.of_batch(b)
        rows += sum(len(tiling.kv_range(i)) * (tiling.q_rows(i).stop - tiling.q_rows(i).start)
                    for i in range(tiling.n_q_tiles))
    nbytes = heads_per_batch * rows * (3 + (d if level == "full" else 0)) * STATE_DTYPE.itemsize
    if nbytes > DEFAULT_TRACE_BUDGET_BYTES:
        raise ValueError(f"a {level!r} trace would hold {nbytes / MiB:.1f} MiB (limit "
                         f"{DEFAULT_TRACE_BUDGET_BYTES / MiB:.0f} MiB); pass trace=\"none\" or a shorter cache")
