"""The simulated GPU: HBM and SRAM as explicit objects that count every byte that crosses between them.

Every transfer is a visible call: `hbm.read`, `hbm.write`, `sram.load`, `sram.store`. HBM keeps a
ledger of bytes by (kernel, tensor, direction); SRAM tracks live and peak bytes per buffer and
refuses a tile set that does not fit. Both hand out frozen snapshots (`Traffic`, `OnChipStats`).

The rules that keep the two honest (each broken one is an error naming what was expected):

- A transfer selects a rectangular block with a *basic* index: ints and slices (and `...`). An
  integer-array or boolean index makes NumPy select a copy, so a write through it would count bytes
  and store nothing; partial writes of a matrix go through `write_where` with a boolean mask.
- Values written match the selected block's shape exactly (a scalar fills it).
- A tiled kernel brings a tile on chip with `sram.load`, never with `hbm.read`: the load reads HBM
  *and* holds the tile in shared memory, so the capacity check sees every byte that lands on chip.
  The CTAs of a tiled kernel get an HBM view (`HBM.tiled_view`, handed out by
  `SimulatedGPU.for_cta`) that refuses `read` and `read_where`. `hbm.read` itself stays for kernels
  whose on-chip footprint simflash does not model (the naive baseline's library kernels) and for tests.
- A buffer name is held at most once at a time, in one scope; freeing a name that is not held fails.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping

import attrs
import numpy as np
from numpy.typing import ArrayLike

from simflash.config import KiB, STATE_DTYPE
from simflash.l2 import L2

LedgerKey = tuple[str, str]  # (kernel, tensor)


class SRAMOverflowError(ValueError):
    """The tiles a kernel holds at once do not fit in the configured SRAM capacity."""


class OnChipBufferError(ValueError):
    """A buffer held twice, or freed without being held."""


class DirectReadError(RuntimeError):
    """A tiled kernel's CTA read HBM without holding the tile on chip (use `sram.load`)."""


def _basic_index(tensor: str, index: object) -> tuple:
    """`index` as a tuple of ints, slices and Ellipsis, or a TypeError naming the argument."""
    index = index if isinstance(index, tuple) else (index,)
    for position, item in enumerate(index):
        if type(item) is slice or type(item) is int:  # what tiled kernels pass for every tile: checked first
            continue
        basic = item is Ellipsis or isinstance(item, slice) or (
            isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)))
        if not basic:
            shown = (f"an array of dtype {item.dtype} and shape {item.shape}" if isinstance(item, np.ndarray)
                     else f"{type(item).__name__} {item!r}")
            raise TypeError(
                f"index into {tensor!r} must be basic (ints, slices, ...), got {shown} "
                f"at position {position}: an integer-array or boolean index selects a copy, so "
                f"a write through it would store nothing; select a rectangular block, and use write_where "
                f"with a boolean mask for a partial write")
    return index


def _check_values(tensor: str, values: ArrayLike, shape: tuple[int, ...]) -> None:
    """Written values must have the selected block's shape (a scalar fills the block)."""
    if np.ndim(values) != 0 and np.shape(values) != shape:
        raise ValueError(
            f"values written to {tensor!r} must have the selected block's shape {shape} (or be a scalar), "
            f"got shape {np.shape(values)}")


def _check_mask(tensor: str, stored: object, shape: tuple[int, ...]) -> np.ndarray:
    """A boolean mask that broadcasts to the selected block's shape, or a ValueError naming `stored`."""
    mask = np.asarray(stored)
    if mask.dtype != np.bool_:
        raise ValueError(f"stored (the mask for {tensor!r}) must be a boolean array or None, got dtype {mask.dtype}")
    try:
        broadcast = np.broadcast_shapes(mask.shape, shape)
    except ValueError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(
            f"stored (the mask for {tensor!r}) must broadcast to the selected block's shape {shape}, "
            f"got shape {mask.shape}")
    return mask


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
    l2: L2 | None = None  # when set, every transfer also passes through this L2

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

    def read(self, tensor: str, index: tuple = (...,), *, shared: bool = False, again: bool = False) -> np.ndarray:
        """Move `tensor[index]` to the chip: counts its bytes, returns a float32 copy that nothing on
        chip holds. Tiled kernels use `sram.load` instead, which reads through here and holds the tile
        in shared memory; their CTAs' HBM view refuses this call (see the module docstring). `shared`:
        a read several CTAs make at once, counted once (the L2 holds it as data every SM reads). `again`:
        a block this kernel has read already, read once more as a GEMM's tiles are: the L2 sees it, the
        ledger (the logical model, each operand once) does not."""
        return self._fetch(tensor, index, shared, again)

    def _fetch(self, tensor: str, index: tuple = (...,), shared: bool = False, again: bool = False) -> np.ndarray:
        """The transfer behind `read` and `sram.load`."""
        stored = self._stored(tensor)
        index = _basic_index(tensor, index)
        block = self._float32.get(tensor, stored)[index].astype(STATE_DTYPE)  # a float32 copy
        self._count(self._read, tensor, block.size * stored.itemsize, index, shared, again)
        return block

    def write(self, tensor: str, index: tuple | slice, values: np.ndarray | float) -> None:
        """Move `values` from the chip into `tensor[index]`, rounding to the tensor's dtype.

        `index` is basic (ints, slices); `values` has the block's shape or is a scalar that fills it."""
        index = _basic_index(tensor, index)
        target = self._stored(tensor)[index]  # a view: basic indexing
        _check_values(tensor, values, target.shape)
        target[...] = values
        self._widen(tensor, index)
        self._count(self._written, tensor, target.nbytes, index)

    def atomic_add(self, tensor: str, index: tuple, values: np.ndarray) -> None:
        """Add `values` into `tensor[index]` by atomic adds: the SM sends the addends and the L2 does the
        read-modify-write, so the ledger counts what the SM sends, a write of the addends (no read)."""
        index = _basic_index(tensor, index)
        target = self._stored(tensor)[index]  # a view: basic indexing
        _check_values(tensor, values, target.shape)
        target += values
        self._widen(tensor, index)
        self._count(self._written, tensor, target.nbytes, index)

    def read_where(self, tensor: str, stored: np.ndarray | None, fill: float, index: tuple = (...,)) -> np.ndarray:
        """Read the elements of `tensor[index]` where `stored` is True (None: all); the others come
        back as `fill`. For matrices a kernel stored only in part, such as the permitted triangle of causal S."""
        itemsize = self._stored(tensor).itemsize
        index = _basic_index(tensor, index)
        values = self._float32.get(tensor, self._tensors[tensor])[index]  # the float32 twin, if it has one
        if stored is None:
            self._count(self._read, tensor, values.size * itemsize, index)
            return values.astype(STATE_DTYPE)
        mask = _check_mask(tensor, stored, values.shape)
        self._count(self._read, tensor, _stored_count(mask, values.shape) * itemsize, index)
        return np.where(mask, values, fill).astype(STATE_DTYPE)

    def write_where(self, tensor: str, values: np.ndarray, stored: np.ndarray | None, index: tuple = (...,)) -> None:
        """Write `values` into `tensor[index]` where `stored` is True (None: everywhere); the rest is never stored.

        `values` has the selected block's shape exactly; `stored` is a boolean mask that broadcasts to it."""
        index = _basic_index(tensor, index)
        target = self._stored(tensor)[index]  # a view: basic indexing
        if np.shape(values) != target.shape:
            raise ValueError(f"values written to {tensor!r} must have the selected block's shape {target.shape}, "
                             f"got shape {np.shape(values)}")
        if stored is None:
            target[...] = values
            self._widen(tensor, index)
            self._count(self._written, tensor, target.nbytes, index)
            return
        mask = _check_mask(tensor, stored, target.shape)
        np.copyto(target, values, where=mask, casting="unsafe")
        self._widen(tensor, index)
        self._count(self._written, tensor, _stored_count(mask, target.shape) * target.itemsize, index)

    def tiled_view(self) -> TiledHBM:
        """This HBM as a tiled kernel's CTA sees it: writes as here, reads only through `sram.load`."""
        return TiledHBM(self)

    def _stored(self, tensor: str) -> np.ndarray:
        try:
            return self._tensors[tensor]
        except KeyError:
            raise KeyError(f"no tensor {tensor!r} in HBM (placed or allocated: {', '.join(self._tensors) or 'none'})"
                           ) from None

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

    def _count(self, counter: dict[LedgerKey, int], tensor: str, nbytes: int, index: tuple = (...,),
               shared: bool = False, again: bool = False) -> None:
        """A transfer into the ledger (but a read `again`, which only the L2 sees) and through the L2."""
        if self._kernel is None:
            raise RuntimeError(f"HBM transfer of {tensor!r} outside a kernel: wrap it in `with hbm.kernel(name):`")
        if not again:
            key = (self._kernel, tensor)
            counter[key] = counter.get(key, 0) + nbytes
            if self.log is not None:
                self.log.add("read" if counter is self._read else "write", tensor, nbytes, "hbm")
        if self.l2 is not None:
            block = _block_key(tensor, index)
            if counter is self._read:
                self.l2.read(block, nbytes, shared=shared, again=again)
            else:
                self.l2.write(block, nbytes)


class TiledHBM:
    """A tiled kernel's CTA view of an HBM: everything passes through to it except `read` and
    `read_where`, which raise, because a tile must land on chip through `sram.load` (which holds it in
    shared memory, where the capacity check sees it)."""

    def __init__(self, hbm: HBM) -> None:
        self._hbm = hbm

    def __getattr__(self, name: str):
        return getattr(self._hbm, name)

    def tiled_view(self) -> TiledHBM:
        return self

    # What `sram.load` calls for every tile, passed through without __getattr__'s lookup
    def _fetch(self, tensor: str, index: tuple = (...,)) -> np.ndarray:
        return self._hbm._fetch(tensor, index)

    def itemsize(self, tensor: str) -> int:
        return self._hbm.itemsize(tensor)

    def read(self, tensor: str, index: tuple = (...,), *, shared: bool = False, again: bool = False) -> np.ndarray:
        raise DirectReadError(
            f"hbm.read({tensor!r}, ...) inside a tiled kernel's CTA: the tile would land on chip without "
            f"being held, out of sight of the SRAM capacity check; load it with "
            f"sram.load(buffer, hbm, {tensor!r}, index) and free the buffer when done")

    def read_where(self, tensor: str, *args, **kwargs) -> np.ndarray:
        raise DirectReadError(
            f"hbm.read_where({tensor!r}, ...) inside a tiled kernel's CTA: load tiles with "
            f"sram.load(buffer, hbm, {tensor!r}, index) so the SRAM capacity check sees them")


def _block_key(tensor: str, index: tuple) -> tuple:
    """The L2 block a transfer touches: (tensor, head, first row), and the first column where the index
    slices columns too, as simflash.grid.block_key names it."""
    head = index[0] if index and isinstance(index[0], (int, np.integer)) else 0
    rows = index[1] if len(index) > 1 and isinstance(index[1], slice) else slice(0, None)
    # A ledger label such as "O (init)" names a phase of tensor O, not other memory: same block.
    key = (tensor.split(" (")[0], int(head), rows.start or 0)
    return (*key, index[2].start or 0) if len(index) > 2 and isinstance(index[2], slice) else key


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
    _live_bytes: int = attrs.field(default=0, init=False)  # sum of _live's values, kept as buffers come and go
    _peak_bytes: int = 0
    _peak_by_buffer: dict[str, int] = attrs.field(factory=dict)

    def hold(self, buffer: str, nbytes: int) -> None:
        if buffer in self._live:
            raise OnChipBufferError(
                f"buffer {buffer!r} is already held in {self.name} ({self._live[buffer]} bytes): free it "
                f"before holding it again, or give the second one its own name")
        self._live[buffer] = nbytes
        self._live_bytes += nbytes
        live_bytes = self._live_bytes
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
        if buffer not in self._live:
            raise OnChipBufferError(
                f"cannot free buffer {buffer!r}: {self.name} does not hold it "
                f"(held: {', '.join(self._live) or 'nothing'})")
        nbytes = self._live.pop(buffer)
        self._live_bytes -= nbytes
        if self.log is not None:
            self.log.add("release", buffer, nbytes, self.name)

    def holds(self, buffer: str) -> bool:
        return buffer in self._live

    @property
    def live_bytes(self) -> int:
        return self._live_bytes

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

    def load(self, buffer: str, hbm: HBM | TiledHBM, tensor: str, index: tuple) -> np.ndarray:
        """Copy a tile from HBM into shared-memory buffer `buffer`; returns it as float32.

        The way a tiled kernel brings a tile on chip: the read is counted and the tile held (and
        capacity-checked) in one call."""
        self._check_free(buffer, self.registers)
        tile = hbm._fetch(tensor, index)
        self.shared.hold(buffer, tile.size * hbm.itemsize(tensor))
        return tile

    def store(self, hbm: HBM | TiledHBM, tensor: str, index: tuple | slice, values: np.ndarray) -> None:
        """Copy values held on chip out to HBM."""
        hbm.write(tensor, index, values)

    def alloc(self, buffer: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Reserve a shared-memory buffer for an intermediate that never leaves the chip."""
        self._check_free(buffer, self.registers)
        self.shared.hold(buffer, math.prod(shape) * np.dtype(dtype).itemsize)

    def state(self, buffer: str, shape: tuple[int, ...], fill: float) -> np.ndarray:
        """A float32 register-held state array (m, l, a), initialised to `fill`."""
        self._check_free(buffer, self.shared)
        self.registers.hold(buffer, math.prod(shape) * STATE_DTYPE.itemsize)
        return np.full(shape, fill, dtype=STATE_DTYPE)

    def free(self, *buffers: str) -> None:
        for buffer in buffers:
            if self.shared.holds(buffer):
                self.shared.release(buffer)
            elif self.registers.holds(buffer):
                self.registers.release(buffer)
            else:
                held = [*self.shared._live, *self.registers._live]
                raise OnChipBufferError(
                    f"cannot free buffer {buffer!r}: it is not held in shared memory or registers "
                    f"(held: {', '.join(held) or 'nothing'})")

    @staticmethod
    def _check_free(buffer: str, other: OnChipScope) -> None:
        """One name, one buffer: a name held in the other scope cannot be held here too."""
        if other.holds(buffer):
            raise OnChipBufferError(f"buffer {buffer!r} is already held in {other.name}: free it first, "
                                    f"or give the second one its own name")

    def statistics(self) -> OnChipStats:
        return OnChipStats(self.shared.statistics(), self.registers.statistics())


@attrs.define
class Compute:
    """The chip's arithmetic, counted as it runs: matrix products on the tensor cores (2mnk FLOPs
    each, `flops`), and the elementwise work beside them: exponentials on the special-function
    units (`exp_ops`), divisions (`div_ops`: a float32 division is a reciprocal on the special-function
    units and a multiply, so it is counted apart) and other float32 operations (`fp32_flops`: scale,
    max, subtract, sum, rescale)."""

    flops: int = 0
    exp_ops: int = 0
    fp32_flops: int = 0
    div_ops: int = 0
    log: EventLog | None = None

    def elementwise(self, exp: int = 0, fp32: int = 0, div: int = 0) -> None:
        self.exp_ops += exp
        self.fp32_flops += fp32
        self.div_ops += div

    def flops_by_kind(self) -> dict[str, int]:
        return {"tensor": self.flops, "exp": self.exp_ops, "fp32": self.fp32_flops, "div": self.div_ops}

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # OpenBLAS can leave the invalid flag raised for finite operands (numpy/numpy#24067), which NumPy then
        # reports as a warning; a NaN from real operands still shows in the product.
        with np.errstate(invalid="ignore"):
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

    hbm: HBM | TiledHBM  # a CTA view (for_cta) is the TiledHBM of the shared HBM
    sram: SRAM
    compute: Compute
    log: EventLog | None = None
    _cta_srams: list[SRAM] = attrs.field(factory=list)

    @classmethod
    def build(cls, sram_bytes: int, record_events: bool = False, register_bytes: int | None = None,
              l2: L2 | None = None) -> SimulatedGPU:
        log = EventLog() if record_events else None
        return cls(HBM(log=log, l2=l2), SRAM(sram_bytes, log, register_bytes), Compute(log=log), log)

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
        return SimulatedGPU(self.hbm.tiled_view(), sram, self.compute, self.log)

    def on_chip_statistics(self) -> OnChipStats:
        """Peak on-chip occupancy of the largest CTA (each CTA has its own shared memory and registers)."""
        stats = [s.statistics() for s in self._cta_srams] or [self.sram.statistics()]
        return max(stats, key=lambda s: (s.shared.peak_bytes, s.registers.peak_bytes))
