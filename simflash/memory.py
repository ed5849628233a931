"""The simulated GPU: HBM and SRAM as explicit objects that count every byte that crosses between them.

Every transfer is a visible call: `hbm.read`, `hbm.write`, `sram.load`, `sram.store`. HBM keeps a
ledger of bytes by (kernel, tensor, direction); SRAM tracks live and peak bytes per buffer and
refuses a tile set that does not fit. Both hand out frozen snapshots (`Traffic`, `OnChipStats`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping

import attrs
import numpy as np

from simflash.config import KiB, STATE_DTYPE
from simflash.l2 import L2Cache

LedgerKey = tuple[str, str]  # (kernel, tensor)


class SRAMOverflowError(ValueError):
    """The tiles a kernel holds at once do not fit in the configured SRAM capacity."""


@attrs.frozen
class MemoryEvent:
    """One thing the simulated GPU did, in order: the material for timelines (e.g. Perfetto)."""

    seq: int  # logical clock: the event's position in the run
    kernel: str | None
    cta: tuple[int, ...]  # the CTA that did it, e.g. (head, query tile); () outside any CTA
    op: str  # "read" | "write" (HBM), "hold" | "release" (on-chip buffer), "matmul"
    name: str  # tensor, buffer or product
    nbytes: int  # bytes moved or held; FLOPs for "matmul"
    scope: str = "hbm"  # "hbm", "shared memory", "registers" or "compute"


@attrs.define
class EventLog:
    """Collects MemoryEvents when a run asks for them; knows the current kernel and CTA."""

    events: list[MemoryEvent] = attrs.field(factory=list)
    kernel: str | None = None
    cta: tuple[int, ...] = ()

    def add(self, op: str, name: str, nbytes: int, scope: str) -> None:
        self.events.append(MemoryEvent(len(self.events), self.kernel, self.cta, op, name, nbytes, scope))


@attrs.frozen
class Flow:
    """Bytes moved in each direction between HBM and the chip."""

    read_bytes: int = 0
    write_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def __add__(self, other: Flow) -> Flow:
        return Flow(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)


def _sum_flows(flows: Mapping[LedgerKey, Flow], key_index: int) -> dict[str, Flow]:
    grouped: dict[str, Flow] = {}
    for key, flow in flows.items():
        grouped[key[key_index]] = grouped.get(key[key_index], Flow()) + flow
    return grouped


@attrs.frozen(hash=False)
class Traffic:
    """HBM traffic of a run (or of the closed-form model): the ledger and its sums, in bytes."""

    ledger: Mapping[LedgerKey, Flow] = attrs.field(factory=dict)

    @property
    def read_bytes(self) -> int:
        return sum(flow.read_bytes for flow in self.ledger.values())

    @property
    def write_bytes(self) -> int:
        return sum(flow.write_bytes for flow in self.ledger.values())

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @property
    def by_tensor(self) -> dict[str, Flow]:
        return _sum_flows(self.ledger, 1)

    @property
    def by_kernel(self) -> dict[str, Flow]:
        return _sum_flows(self.ledger, 0)

    def times(self, count: int) -> Traffic:
        """The traffic of `count` independent copies of this workload (e.g. heads)."""
        return Traffic({key: Flow(f.read_bytes * count, f.write_bytes * count) for key, f in self.ledger.items()})

    def to_dict(self) -> dict:
        return {
            "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes,
            "total_bytes": self.total_bytes,
            "by_kernel": {k: attrs.asdict(f) for k, f in self.by_kernel.items()},
            "by_tensor": {t: attrs.asdict(f) for t, f in self.by_tensor.items()},
        }


@attrs.define
class HBM:
    """Off-chip memory: named tensors in a storage dtype, and a ledger of every byte moved.

    Each placed input that is not float32 also keeps a float32 twin (exact: fp16 and bf16 values are
    all float32 values), so reading a tile is a slice and a copy, not a conversion per tile. Bytes are
    counted at the storage itemsize all the same, and a write rounds to the storage dtype first and
    then brings the twin up to date.
    """

    _tensors: dict[str, np.ndarray] = attrs.field(factory=dict)
    _float32: dict[str, np.ndarray] = attrs.field(factory=dict)  # float32 twins of placed inputs
    _read: dict[LedgerKey, int] = attrs.field(factory=dict)
    _written: dict[LedgerKey, int] = attrs.field(factory=dict)
    _kernel: str | None = None
    log: EventLog | None = None
    l2: L2Cache | None = None  # when set, every transfer also passes through this L2

    def place(self, name: str, values: np.ndarray, dtype: np.dtype) -> None:
        """Put an input in HBM before any kernel runs (rounded to `dtype`; not kernel traffic)."""
        stored = np.asarray(values).astype(dtype)
        self._tensors[name] = stored
        if stored.dtype == STATE_DTYPE:
            self._float32.pop(name, None)
        else:
            self._float32[name] = stored.astype(STATE_DTYPE)

    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype, poison: bool = True) -> None:
        """Reserve an output tensor, poisoned with NaN so an element no kernel wrote shows up.

        poison=False leaves it uninitialised, for tensors only ever read where they were written.
        """
        self._tensors[name] = np.full(shape, np.nan, dtype=dtype) if poison else np.empty(shape, dtype=dtype)
        self._float32.pop(name, None)

    @contextlib.contextmanager
    def kernel(self, name: str) -> Iterator[None]:
        """Attribute the traffic inside the block to kernel `name`."""
        self._kernel = name
        if self.log is not None:
            self.log.kernel = name
        if self.l2 is not None:
            self.l2.kernel = name
        try:
            yield
        finally:
            if self.l2 is not None:
                self.l2.end_kernel()
            self._kernel = None
            if self.log is not None:
                self.log.kernel = None

    def read(self, tensor: str, index: tuple = (...,)) -> np.ndarray:
        """Move `tensor[index]` to the chip: counts its bytes, returns a float32 copy."""
        stored = self._tensors[tensor]
        block = self._float32.get(tensor, stored)[index].astype(STATE_DTYPE)  # a float32 copy
        self._count(self._read, tensor, block.size * stored.itemsize, index)
        return block

    def write(self, tensor: str, index: tuple, values: np.ndarray | float) -> None:
        """Move `values` from the chip into `tensor[index]`, rounding to the tensor's dtype."""
        target = self._tensors[tensor][index]
        target[...] = values
        self._widen(tensor, index)
        self._count(self._written, tensor, target.nbytes, index)

    def read_where(self, tensor: str, stored: np.ndarray | None, fill: float, index: tuple = (...,)) -> np.ndarray:
        """Read the elements of `tensor[index]` where `stored` is True (None: all); the others come
        back as `fill`. For matrices a kernel stored only in part, such as the permitted triangle of causal S."""
        itemsize = self._tensors[tensor].itemsize
        values = self._float32.get(tensor, self._tensors[tensor])[index]  # the float32 twin, if it has one
        if stored is None:
            self._count(self._read, tensor, values.size * itemsize, index)
            return values.astype(STATE_DTYPE)
        self._count(self._read, tensor, _stored_count(stored, values.shape) * itemsize, index)
        return np.where(stored, values, fill).astype(STATE_DTYPE)

    def write_where(self, tensor: str, values: np.ndarray, stored: np.ndarray | None, index: tuple = (...,)) -> None:
        """Write `values` into `tensor[index]` where `stored` is True (None: everywhere); the rest is never stored."""
        target = self._tensors[tensor][index]
        if stored is None:
            target[...] = values
            self._widen(tensor, index)
            self._count(self._written, tensor, target.nbytes, index)
            return
        np.copyto(target, values, where=stored, casting="unsafe")
        self._widen(tensor, index)
        self._count(self._written, tensor, _stored_count(stored, target.shape) * target.itemsize, index)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self._tensors[tensor].shape

    def inspect(self, tensor: str) -> np.ndarray:
        """What `tensor` holds now, for the user and the tests; not a transfer, not counted."""
        return self._tensors[tensor]

    def itemsize(self, tensor: str) -> int:
        return self._tensors[tensor].itemsize

    def traffic(self) -> Traffic:
        keys = list(dict.fromkeys([*self._read, *self._written]))
        return Traffic({key: Flow(self._read.get(key, 0), self._written.get(key, 0)) for key in keys})

    def _widen(self, tensor: str, index: tuple) -> None:
        """After a write to `tensor[index]`: copy the rounded values into the float32 twin, if any."""
        twin = self._float32.get(tensor)
        if twin is not None:
            twin[index] = self._tensors[tensor][index]

    def _count(self, counter: dict[LedgerKey, int], tensor: str, nbytes: int, index: tuple = (...,)) -> None:
        if self._kernel is None:
            raise RuntimeError(f"HBM transfer of {tensor!r} outside a kernel: wrap it in `with hbm.kernel(name):`")
        key = (self._kernel, tensor)
        counter[key] = counter.get(key, 0) + nbytes
        if self.log is not None:
            self.log.add("read" if counter is self._read else "write", tensor, nbytes, "hbm")
        if self.l2 is not None:
            block = _block_key(tensor, index)
            if counter is self._read:
                self.l2.read(block, nbytes)
            else:
                self.l2.write(block, nbytes)


def _block_key(tensor: str, index: tuple) -> tuple:
    """The L2 block a transfer touches: (tensor, head, first row), as simflash.grid.block_key names it."""
    head = index[0] if index and isinstance(index[0], (int, np.integer)) else 0
    rows = index[1] if len(index) > 1 and isinstance(index[1], slice) else slice(0, None)
    return (tensor, int(head), rows.start or 0)


def _stored_count(stored: np.ndarray, shape: tuple[int, ...]) -> int:
    """Elements selected by a (broadcast) boolean mask over an array of `shape`."""
    return int(np.count_nonzero(stored)) * (int(np.prod(shape)) // stored.size)


@attrs.frozen
class ScopeStats:
    """Peak occupancy of one on-chip scope, in bytes, in total and by buffer."""

    name: str
    capacity_bytes: int | None
    peak_bytes: int
    peak_by_buffer: Mapping[str, int]


@attrs.define
class OnChipScope:
    """Live and peak bytes of the named buffers held in one on-chip scope."""

    name: str
    capacity_bytes: int | None = None
    log: EventLog | None = None
    advice: str = "choose smaller block_q/block_kv or a larger sram_bytes"  # what to do on overflow
    _live: dict[str, int] = attrs.field(factory=dict)
    _peak_bytes: int = 0
    _peak_by_buffer: dict[str, int] = attrs.field(factory=dict)

    def hold(self, buffer: str, nbytes: int) -> None:
        self._live[buffer] = nbytes
        live_bytes = self.live_bytes
        if self.capacity_bytes is not None and live_bytes > self.capacity_bytes:
            held = ", ".join(f"{b} {n / KiB:g} KiB" for b, n in self._live.items())
            raise SRAMOverflowError(
                f"tiles do not fit in {self.name}: {held} = {live_bytes / KiB:g} KiB > capacity "
                f"{self.capacity_bytes / KiB:g} KiB; {self.advice}"
            )
        self._peak_bytes = max(self._peak_bytes, live_bytes)
        self._peak_by_buffer[buffer] = max(self._peak_by_buffer.get(buffer, 0), nbytes)
        if self.log is not None:
            self.log.add("hold", buffer, nbytes, self.name)

    def release(self, buffer: str) -> None:
        nbytes = self._live.pop(buffer)
        if self.log is not None:
            self.log.add("release", buffer, nbytes, self.name)

    def holds(self, buffer: str) -> bool:
        return buffer in self._live

    @property
    def live_bytes(self) -> int:
        return sum(self._live.values())

    def statistics(self) -> ScopeStats:
        return ScopeStats(self.name, self.capacity_bytes, self._peak_bytes, dict(self._peak_by_buffer))


@attrs.frozen
class OnChipStats:
    shared: ScopeStats
    registers: ScopeStats


@attrs.define
class SRAM:
    """On-chip memory of one CTA: shared-memory tiles and register-held state, each capacity-checked
    (register_bytes: the CTA's share of the register file; None leaves registers unchecked)."""

    capacity_bytes: int
    log: EventLog | None = None
    register_bytes: int | None = None
    shared: OnChipScope = attrs.field(init=False)
    registers: OnChipScope = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.shared = OnChipScope("shared memory", self.capacity_bytes, self.log)
        self.registers = OnChipScope("registers", self.register_bytes, self.log,
                                     advice="choose smaller block_q/block_kv or a smaller d")

    def load(self, buffer: str, hbm: HBM, tensor: str, index: tuple) -> np.ndarray:
        """Copy a tile from HBM into shared-memory buffer `buffer`; returns it as float32."""
        tile = hbm.read(tensor, index)
        self.shared.hold(buffer, tile.size * hbm.itemsize(tensor))
        return tile

    def store(self, hbm: HBM, tensor: str, index: tuple, values: np.ndarray) -> None:
        """Copy values held on chip out to HBM."""
        hbm.write(tensor, index, values)

    def alloc(self, buffer: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Reserve a shared-memory buffer for an intermediate that never leaves the chip."""
        self.shared.hold(buffer, math.prod(shape) * np.dtype(dtype).itemsize)

    def state(self, buffer: str, shape: tuple[int, ...], fill: float) -> np.ndarray:
        """A float32 register-held state array (m, l, a), initialised to `fill`."""
        self.registers.hold(buffer, math.prod(shape) * STATE_DTYPE.itemsize)
        return np.full(shape, fill, dtype=STATE_DTYPE)

    def free(self, *buffers: str) -> None:
        for buffer in buffers:
            scope = self.shared if self.shared.holds(buffer) else self.registers
            scope.release(buffer)

    def statistics(self) -> OnChipStats:
        return OnChipStats(self.shared.statistics(), self.registers.statistics())


@attrs.define
class Compute:
    """The chip's arithmetic, counted as it runs: matrix products on the tensor cores (2mnk FLOPs
    each, `flops`), and the elementwise work beside them: exponentials on the special-function
    units (`exp_ops`) and other float32 operations (`fp32_flops`: scale, max, sum, rescale, divide)."""

    flops: int = 0
    exp_ops: int = 0
    fp32_flops: int = 0
    log: EventLog | None = None

    def elementwise(self, exp: int = 0, fp32: int = 0) -> None:
        self.exp_ops += exp
        self.fp32_flops += fp32

    def flops_by_kind(self) -> dict[str, int]:
        return {"tensor": self.flops, "exp": self.exp_ops, "fp32": self.fp32_flops}

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        product = a @ b
        flops = 2 * product.size * a.shape[-1]
        self.flops += flops
        if self.log is not None:
            self.log.add("matmul", f"{a.shape} @ {b.shape}", flops, "compute")
        return product


@attrs.define
class SimulatedGPU:
    """HBM, one CTA's SRAM and the arithmetic units: what an algorithm runs on.

    With `log`, every transfer, buffer hold/release and matmul is also recorded as a MemoryEvent.
    """

    hbm: HBM
    sram: SRAM
    compute: Compute
    log: EventLog | None = None
    _cta_srams: list[SRAM] = attrs.field(factory=list)

    @classmethod
    def build(cls, sram_bytes: int, record_events: bool = False, register_bytes: int | None = None) -> SimulatedGPU:
        log = EventLog() if record_events else None
        return cls(HBM(log=log), SRAM(sram_bytes, log, register_bytes), Compute(log=log), log)

    @contextlib.contextmanager
    def cta(self, *index: int) -> Iterator[None]:
        """Attribute the work inside the block to one CTA (thread block), e.g. (head, query tile)."""
        if self.log is not None:
            self.log.cta = index
        try:
            yield
        finally:
            if self.log is not None:
                self.log.cta = ()

    def for_cta(self, index: tuple[int, ...]) -> SimulatedGPU:
        """The view one CTA runs on: the shared HBM and arithmetic, and its own SRAM (CTAs resident
        together each hold their tiles). `statistics()` reports the largest CTA's occupancy."""
        sram = SRAM(self.sram.capacity_bytes, self.log, self.sram.register_bytes)
        self._cta_srams.append(sram)
        return SimulatedGPU(self.hbm, sram, self.compute, self.log)

    def on_chip_statistics(self) -> OnChipStats:
        """Peak on-chip occupancy of the largest CTA (each CTA has its own shared memory and registers)."""
        stats = [s.statistics() for s in self._cta_srams] or [self.sram.statistics()]
        return max(stats, key=lambda s: (s.shared.peak_bytes, s.registers.peak_bytes))
