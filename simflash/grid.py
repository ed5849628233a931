"""The grid runner: a kernel's CTAs launched in blockIdx order onto the chip's CTA slots.

Two schedules:

- "sequential": one CTA after another (the order a debugger steps through);
- "concurrent": as many CTAs resident as the chip has slots, advancing in lock-step, one step each in
  turn; a slot that frees takes the next CTA in blockIdx order at the next step. This is the order in
  which the L2 sees the transfers.

A step is the work a CTA does between two yields (for FA-2: one KV tile). Within a time step the
resident CTAs run in *cohorts*: CTAs that started together on the same stream of shared blocks (same
head, same first KV tile) run back to back, members in blockIdx order. Outputs and the logical ledger
do not depend on the schedule; only the L2 does.

The same runner drives CTAs with values (generators that call hbm.read/hbm.write) and CTAs without
values (`CTAProgram`s that list their transfers), so a traffic-only run sees exactly the order a run
with values sees. In a step where no CTA of a cohort has a private transfer, the cohort's identical
reads of one block are passed to the L2 as one read with a count: back-to-back reads of the same block
leave an LRU cache in the same state whatever their number.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Literal

import attrs

from simflash.l2 import BlockKey, L2Cache

Schedule = Literal["sequential", "concurrent"]
SCHEDULES = ("sequential", "concurrent")


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return schedule


@attrs.frozen
class Access:
    """One block moved between HBM and a CTA."""

    key: BlockKey  # (tensor, head, block index)
    nbytes: int
    write: bool = False


@attrs.frozen
class Stream:
    """The blocks a CTA reads or writes at each step: at step t, block `first + t` of each tensor."""

    head: int
    first: int
    tensors: tuple[tuple[str, bool], ...]  # (tensor, write)
    block_bytes: Callable[[str, int], int] = attrs.field(eq=False)  # (tensor, block) -> bytes

    def accesses(self, step: int) -> Iterator[Access]:
        for tensor, write in self.tensors:
            yield Access((tensor, self.head, self.first + step), self.block_bytes(tensor, self.first + step), write)


@attrs.frozen
class CTAProgram:
    """One CTA's transfers without values: prologue at step 0, the stream's blocks at steps 0..n-1,
    the epilogue at step n (step 0 when n = 0); the CTA holds its slot for n + 1 steps."""

    index: tuple[int, ...]
    n_steps: int
    stream: Stream
    prologue: tuple[Access, ...] = ()
    epilogue: tuple[Access, ...] = ()


@attrs.define
class _Cohort:
    """CTAs that started at the same step on the same stream; members in blockIdx order."""

    start: int
    members: list = attrs.field(factory=list)  # CTAProgram (traffic-only) or generator (with values)
    next_end: int = 0  # the earliest time step at which a member takes its final step


def cohort_key(program: CTAProgram) -> Hashable:
    return (program.stream.head, program.stream.first, program.stream.tensors)


def run_programs(programs: Iterable[CTAProgram], slots: int, l2: L2Cache) -> int:
    """Play CTA programs through the L2 in the concurrent schedule (slots=1: sequential).

    Returns the number of time steps the kernel took (its makespan in steps)."""
    pending = iter(programs)
    cohorts: list[_Cohort] = []
    resident = 0
    time = 0
    while True:
        starting: dict[Hashable, _Cohort] = {}
        while resident < slots:
            program = next(pending, None)
            if program is None:
                break
            cohort = starting.get(cohort_key(program))
            if cohort is None:
                cohort = starting[cohort_key(program)] = _Cohort(time, next_end=time + program.n_steps)
                cohorts.append(cohort)
            cohort.members.append(program)
            cohort.next_end = min(cohort.next_end, time + program.n_steps)
            resident += 1
        if not cohorts:
            return time
        for cohort in cohorts:
            _play_step(cohort, time, l2)
        for cohort in cohorts:
            if cohort.next_end == time:
                before = len(cohort.members)
                cohort.members = [p for p in cohort.members if cohort.start + p.n_steps > time]
                resident -= before - len(cohort.members)
                cohort.next_end = min((cohort.start + p.n_steps for p in cohort.members), default=time)
        cohorts = [c for c in cohorts if c.members]
        time += 1


def _play_step(cohort: _Cohort, time: int, l2: L2Cache) -> None:
    step = time - cohort.start
    if step > 0 and time < cohort.next_end:  # every member streams, none has a private transfer
        for access in cohort.members[0].stream.accesses(step):
            if access.write:
                l2.write(access.key, access.nbytes)
            else:
                l2.read(access.key, access.nbytes, count=len(cohort.members))
        return
    for program in cohort.members:
        _play(program.prologue if step == 0 else (), l2)
        if step < program.n_steps:
            _play(program.stream.accesses(step), l2)
        if step == program.n_steps:
            _play(program.epilogue, l2)


def _play(accesses: Iterable[Access], l2: L2Cache) -> None:
    for access in accesses:
        if access.write:
            l2.write(access.key, access.nbytes)
        else:
            l2.read(access.key, access.nbytes)
