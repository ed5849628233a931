"""A run's MemoryEvents as a Perfetto timeline: Chrome Trace Event JSON (`.perfetto.json`).

The Perfetto UI (and chrome://tracing) opens it. An export for viewing: it holds no tile state, and
Trace.load refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simflash.memory import MemoryEvent
from simflash.trace_schema import plain

# Perfetto's axis is in microseconds: every MemoryEvent gets TICK_US of it, in `seq` order. A slice
# sits strictly inside its tick so that the viewer nests it under its CTA's slice unambiguously.
TICK_US = 10
SLICE_START_US = 1
SLICE_DUR_US = 8
MARK_US = 5


CTA_INDEX_NAMES = ("head", "query tile")  # what a CTA index's coordinates are (simflash.grid.CTA.index)
HBM_TOTAL_COUNTER = "HBM bytes, cumulative (all tensors)"  # its own track: the per-tensor series stack in chrome


def _cta_label(cta: tuple[int, ...]) -> str:
    """A CTA's track name: "CTA head 0" (FA-1, naive), "CTA head 0, query tile 2" (FA-2)."""
    if not cta:
        return "whole kernel"
    names = CTA_INDEX_NAMES if len(cta) <= len(CTA_INDEX_NAMES) else [f"index {k}" for k in range(len(cta))]
    return "CTA " + ", ".join(f"{name} {value}" for name, value in zip(names, cta))


def perfetto_document(events: Sequence[MemoryEvent], config: Mapping[str, Any] | None = None) -> dict:
    """A Chrome Trace Event JSON object for a run's events.

    Tracks: one process per kernel, one thread per CTA in it (a slice spans the CTA's work); slices
    for loads (HBM reads), compute (matmuls) and stores (HBM writes); instant marks where on-chip
    buffers are held and freed. Counters on the "simulated GPU" process: cumulative HBM bytes by
    tensor (one counter whose series chrome://tracing stacks: the top is the total), the total on a
    counter of its own, and live SRAM bytes by scope. Time: `ts` and `dur` in microseconds, as the
    format has them (displayed in ms, the format's default), event `seq` x TICK_US: a logical clock
    (the simulator runs CTAs one after another; the axis counts events, not time).
    """
    records: list[dict] = []
    gpu_pid = 1
    records.append({"ph": "M", "name": "process_name", "pid": gpu_pid, "tid": 0,
                    "args": {"name": "simulated GPU (counters)"}})
    records.append({"ph": "M", "name": "process_sort_index", "pid": gpu_pid, "tid": 0, "args": {"sort_index": 0}})
    pids: dict[str, int] = {}
    tids: dict[tuple[str, tuple[int, ...]], int] = {}
    spans: dict[tuple[str, tuple[int, ...]], list[int]] = {}  # first and last seq of each CTA
    hbm_bytes: dict[str, int] = {}
    live: dict[str, int] = {}
    held: dict[tuple[str, str], int] = {}  # (scope, buffer) -> bytes, to keep the occupancy exact

    for n, event in enumerate(events):
        kernel = event.kernel if event.kernel is not None else "outside any kernel"
        if kernel not in pids:
            pids[kernel] = len(pids) + 2
            records.append({"ph": "M", "name": "process_name", "pid": pids[kernel], "tid": 0,
                            "args": {"name": f"kernel {kernel}"}})
            records.append({"ph": "M", "name": "process_sort_index", "pid": pids[kernel], "tid": 0,
                            "args": {"sort_index": pids[kernel]}})
        track = (kernel, event.cta)
        if track not in tids:
            tids[track] = sum(1 for k, _ in tids if k == kernel) + 1
            records.append({"ph": "M", "name": "thread_name", "pid": pids[kernel], "tid": tids[track],
                            "args": {"name": _cta_label(event.cta)}})
            records.append({"ph": "M", "name": "thread_sort_index", "pid": pids[kernel], "tid": tids[track],
                            "args": {"sort_index": tids[track]}})
            spans[track] = [event.seq, event.seq]
        spans[track][1] = event.seq
        where = {"pid": pids[kernel], "tid": tids[track]}
        tick = event.seq * TICK_US
        slice_at = {"ts": tick + SLICE_START_US, "dur": SLICE_DUR_US, **where}
        mark_at = {"ts": tick + MARK_US, **where}
        args = {"seq": event.seq}

        if event.op in ("read", "write"):
            following = events[n + 1] if n + 1 < len(events) else None
            into = (following.name if following is not None and following.op == "hold"
                    and following.scope == "shared memory" and following.cta == event.cta
                    and following.kernel == event.kernel else None)  # sram.load: read, then hold
            verb, category = ("load", "load") if event.op == "read" else ("store", "store")
            label = f"{verb} {event.name}" + (f" -> {into}" if into else "")
            records.append({"ph": "X", "name": label, "cat": category, **slice_at,
                            "args": {**args, "tensor": event.name, "bytes": event.nbytes}})
            hbm_bytes[event.name] = hbm_bytes.get(event.name, 0) + event.nbytes
            records.append({"ph": "C", "name": "HBM bytes, cumulative", "pid": gpu_pid, "tid": 0,
                            "ts": mark_at["ts"], "args": dict(hbm_bytes)})
            records.append({"ph": "C", "name": HBM_TOTAL_COUNTER, "pid": gpu_pid, "tid": 0,
                            "ts": mark_at["ts"], "args": {"total": sum(hbm_bytes.values())}})
        elif event.op == "matmul":
            records.append({"ph": "X", "name": f"matmul {event.name}", "cat": "compute", **slice_at,
                            "args": {**args, "flops": event.nbytes}})
        elif event.op in ("hold", "release"):
            key = (event.scope, event.name)
            if event.op == "hold":
                live[event.scope] = live.get(event.scope, 0) - held.get(key, 0) + event.nbytes
                held[key] = event.nbytes
            else:
                live[event.scope] = live.get(event.scope, 0) - held.pop(key, event.nbytes)
            verb = "hold" if event.op == "hold" else "free"
            records.append({"ph": "i", "s": "t", "name": f"{verb} {event.name}", "cat": "sram", **mark_at,
                            "args": {**args, "bytes": event.nbytes, "scope": event.scope}})
            records.append({"ph": "C", "name": "SRAM live bytes", "pid": gpu_pid, "tid": 0,
                            "ts": mark_at["ts"], "args": dict(live)})
        else:
            raise ValueError(f"events[{n}].op must be read, write, hold, release or matmul, got {event.op!r}")

    for (kernel, cta), (first, last) in spans.items():
        records.append({"ph": "X", "name": _cta_label(cta), "cat": "cta", "ts": first * TICK_US,
                        "dur": (last - first + 1) * TICK_US, "pid": pids[kernel], "tid": tids[kernel, cta],
                        "args": {"first_seq": first, "last_seq": last}})
    # Parents before children at equal timestamps, whatever order a viewer's sort keeps.
    records.sort(key=lambda r: (r["ph"] != "M", r.get("ts", 0), -r.get("dur", 0)))
    return {
        "traceEvents": records,
        "displayTimeUnit": "ms",  # ts is in us; the format displays ms or ns
        "otherData": {
            "generator": "simflash",
            "clock": f"logical: event seq x {TICK_US} us (the axis counts simulated events, not time)",
            "config": json.dumps(dict(config or {}), default=plain, allow_nan=False),
        },
    }


def write_perfetto(path: str | Path, events: Sequence[MemoryEvent], config: Mapping[str, Any] | None = None) -> Path:
    """Write a run's events as a Perfetto-readable timeline (see perfetto_document)."""
    path = Path(path)
    document = perfetto_document(events, config)
    lines = [json.dumps(record, separators=(",", ":")) for record in document["traceEvents"]]
    other = json.dumps(document["otherData"], indent=2).replace("\n", "\n  ")
    path.write_text('{\n  "traceEvents": [\n    ' + ",\n    ".join(lines) + "\n  ],\n"
                    f'  "displayTimeUnit": "{document["displayTimeUnit"]}",\n  "otherData": {other}\n}}\n')
    return path
