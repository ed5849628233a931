"""The grid runner: a kernel's CTAs launched onto the chip's CTA slots, one step at a time.

Two schedules:

- "sequential": one CTA after another, in the algorithm's natural order (what a debugger steps
  through, and the order of traces);
- "concurrent": the CTAs in launch (blockIdx) order, as many resident as the chip has slots,
  advancing in lock-step, one step each in turn; a slot that frees takes the next CTA at the next
  step. This is the order in which the L2 sees the transfers.

A step is the work a CTA does between two yields (for FA-2: one KV tile). A CTA with n steps holds
its slot for n + 1 time steps: its epilogue (writing O_i) runs on the step after its last tile.
Within a time step the resident CTAs run in *cohorts*: CTAs that started together on the same stream
of blocks (same head, same first KV tile) run back to back, members in launch order. Outputs and the
logical ledger do not depend on the schedule; only what the L2 sees does.

The same loop drives CTAs with values (generators calling hbm.read and hbm.write) and CTAs without
(`CTAProgram`s listing their transfers), so a traffic-only run sees exactly the order a run with
values sees. In a step where every member of a cohort only streams, the members' identical reads of
one block reach the L2 as one read with a count (in both runs): the L2 holds data a cohort reads at
once as it holds shared data, and back-to-back reads of a block otherwise leave it as one read does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Literal

import attrs

from simflash.l2 import L2, BlockKey

Schedule = Literal["sequential", "concurrent"]
SCHEDULES: tuple[Schedule, ...] = ("sequential", "concurrent")


def check_schedule(schedule: object) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return str(schedule)


@attrs.frozen
class CTA:
    """One thread block of a kernel: its index, its steps, and the stream it shares with its cohort."""

    index: tuple[int, ...]  # e.g. (head, query tile)
    n_steps: int  # steps that stream blocks (FA-2: KV tiles visited)
    cohort: Hashable  # CTAs with equal keys that start together read the same block at every step


@attrs.frozen
class Access:
    """One block moved between HBM and a CTA. The key names the block: (tensor, head, first row). A `shared`
    read is one that several CTAs make at once but the ledger counts once (the P V GEMM's chunks of V); a
    read `again` is one the ledger counted already (the Q K GEMM's tiles of Q and K, read once a unit)."""

    key: BlockKey
    nbytes: int
    write: bool = False
    shared: bool = False
    again: bool = False


@attrs.frozen
class CTAProgram:
    """A CTA's transfers without values: the prologue at step 0, `stream(t)` at steps 0..n-1, the
    epilogue at step n."""

    cta: CTA
    stream: Callable[[int], tuple[Access, ...]] = attrs.field(eq=False)
    prologue: tuple[Access, ...] = ()
    epilogue: tuple[Access, ...] = ()


def kv_head(h: int, group: int) -> int:
    """The K/V head that query head h (or packed group h) reads: h // group, with group = query heads per
    K/V head (PyTorch's enable_gqa grouping; 1 for multi-head attention and for packed groups)."""
    return h // group


def block_key(tensor: str, head: int, rows: slice, cols: slice | None = None) -> BlockKey:
    """(tensor, head, first row), and the first column of a piece of a row block (the naive path's P)."""
    return (tensor, head, rows.start) if cols is None else (tensor, head, rows.start, cols.start)


@attrs.define
class _Cohort:
    start: int
    members: list = attrs.field(factory=list)
    next_end: int = 0  # the earliest time step at which a member takes its final step


def lockstep(ctas: Iterable, slots: int, cta_of: Callable[[Any], CTA] = lambda c: c
             ) -> Iterator[tuple[int, list[tuple[int, list, bool]]]]:
    """For each time step: (time, [(step, members, only_streaming) per cohort]), where only_streaming
    says no member starts or ends at this step. slots=1 is the sequential schedule.

    `ctas` in launch order; `cta_of` maps an item to its CTA (items may be programs or bodies)."""
    pending = iter(ctas)
    cohorts: list[_Cohort] = []
    resident = 0
    time = 0
    while True:
        starting: dict[Hashable, _Cohort] = {}
        while resident < slots:
            item = next(pending, None)
            if item is None:
                break
            cta = cta_of(item)
            cohort = starting.get(cta.cohort)
            if cohort is None:
                cohort = starting[cta.cohort] = _Cohort(time, next_end=time + cta.n_steps)
                cohorts.append(cohort)
            cohort.members.append(item)
            cohort.next_end = min(cohort.next_end, time + cta.n_steps)
            resident += 1
        if not cohorts:
            return
        yield time, [(time - c.start, c.members, c.start < time < c.next_end) for c in cohorts]
        for c in cohorts:
            if c.next_end == time:
                before = len(c.members)
                c.members = [m for m in c.members if c.start + cta_of(m).n_steps > time]
                resident -= before - len(c.members)
                c.next_end = min((c.start + cta_of(m).n_steps for m in c.members), default=time)
        cohorts = [c for c in cohorts if c.members]
        time += 1


def run_programs(programs: Iterable[CTAProgram], slots: int, l2: L2) -> list[int]:
    """Play CTA programs through the L2; returns how many CTAs are resident at each time step (as many
    entries as the kernel's makespan in time steps)."""
    resident = []
    for _, cohorts in lockstep(programs, slots, lambda p: p.cta):
        resident.append(sum(len(members) for _, members, _ in cohorts))
        for step, members, only_streaming in cohorts:
            _play_step(step, members, only_streaming, l2)
    return resident


def _play_step(step: int, members: list[CTAProgram], only_streaming: bool, l2: L2) -> None:
    if only_streaming:
        _play(members[0].stream(step), l2, len(members))
        return
    for program in members:
        if step == 0:
            _play(program.prologue, l2)
        if step < program.cta.n_steps:
            _play(program.stream(step), l2)
        if step == program.cta.n_steps:
            _play(program.epilogue, l2)


def _play(accesses: Iterable[Access], l2: L2, members: int = 1) -> None:
    """Transfers through the L2; with `members`, those of a cohort whose members all only stream: their
    identical reads reach the L2 as one read with a count."""
    for access in accesses:
        if access.write:
            l2.write(access.key, access.nbytes)
        else:
            l2.read(access.key, access.nbytes, count=members, shared=access.shared, again=access.again)


class _Held:
    """Stands in for the L2 while one member of a cohort streams a step with values: keeps its transfers."""

    def __init__(self) -> None:
        self.accesses: list[Access] = []

    def read(self, key: BlockKey, nbytes: int, count: int = 1, shared: bool = False, again: bool = False) -> None:
        self.accesses.append(Access(key, nbytes, shared=shared, again=again))

    def write(self, key: BlockKey, nbytes: int) -> None:
        self.accesses.append(Access(key, nbytes, write=True))


def run_bodies(bodies: Mapping[CTA, Callable[[], Iterator]], slots: int, hbm: Any = None) -> Iterator:
    """Drive CTAs with values (generators yielding once per step) in the given schedule; re-yields
    what they yield, except None. Each body must end exactly after its CTA's n_steps + 1 steps.

    With `hbm` (whose `l2`, when set, sees every transfer): in a step where every member of a cohort only
    streams, the members' transfers are held back and reach the L2 as in a traffic-only run, their identical
    reads as one read with a count."""
    running: dict[CTA, Iterator] = {}
    for _, cohorts in lockstep(bodies, slots):
        for step, members, only_streaming in cohorts:
            l2 = hbm.l2 if hbm is not None and only_streaming else None
            if l2 is None:
                yield from (item for cta in members if (item := _advance(running, bodies, cta, step)) is not None)
                continue
            items, streams = [], []
            try:
                for cta in members:
                    hbm.l2 = held = _Held()
                    items.append(_advance(running, bodies, cta, step))
                    streams.append(held.accesses)
            finally:
                hbm.l2 = l2
            if any(stream != streams[0] for stream in streams):
                raise RuntimeError(f"the cohort of CTA {members[0].index} streamed different blocks at step {step}")
            _play(streams[0], l2, len(members))
            yield from (item for item in items if item is not None)


def _advance(running: dict[CTA, Iterator], bodies: Mapping[CTA, Callable[[], Iterator]], cta: CTA, step: int):
    """One step of a CTA's body (started at its first): what it yields, None once it has ended."""
    body = running.get(cta)
    if body is None:
        body = running[cta] = bodies[cta]()
    try:
        item = next(body)
    except StopIteration:
        if step != cta.n_steps:
            raise RuntimeError(f"CTA {cta.index} ended at step {step}, expected {cta.n_steps}") from None
        del running[cta]
        return None
    if step == cta.n_steps:
        raise RuntimeError(f"CTA {cta.index} runs past its {cta.n_steps} steps")
    return item
