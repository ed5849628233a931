"""The L2 cache between HBM and the SMs: what the DRAM sees of the logical traffic.

Write-back, write-allocate, least-recently-used over *blocks* (a tile of a tensor, or a run of rows):
every transfer names the block it touches, so the cache tracks tiles rather than 32-byte sectors
(a tile is read or written whole, so its sectors share one fate). Counted per (kernel, tensor):

- hit bytes: reads served by the L2 (a block already resident);
- DRAM read bytes: reads that missed, filled from DRAM;
- DRAM write bytes: dirty blocks evicted while the kernel runs (charged to the evicted tensor);
- dirty-at-end bytes: dirty blocks still resident when the kernel ends: not yet DRAM traffic, and
  not counted by Nsight Compute for this kernel;
- again bytes: reads of blocks the logical ledger has counted already (the naive Q K GEMM's tiles, read
  once a unit): among the hits and misses, left out of the logical reads.

A write allocates its block dirty without reading DRAM (whole sectors are written). A read of a dirty
block leaves it where it is in the order (a clean block read again moves to the most recent end): what
one kernel wrote for the next to read once (S, P) gives way first once it has been read, not the blocks
still waiting to be (measured: the naive softmax finds S in the L2 whenever it fits beside Q and K).
Capacity is the *effective* capacity one kernel's stream can use, a fitted figure (see the machine
files), not the nameplate size. `flush` writes every dirty block back outside any kernel and empties the
cache: a read-only sweep over a large buffer does this once before a run ("warm"). ncu's
`--cache-control all` before every kernel ("cold") does it too, except that `flush_residue_bytes` of
dirty lines are still waiting to be written back when the kernel starts (measured on an H200: a
read-only kernel after a 48 MiB write shows 2.3 MiB of DRAM writes, benchmarks/gpu/write_sources.json).
`flush(residue=True)` leaves them dirty beside the kernel's data: once the bytes the kernel has brought
in overflow the room beside them, they are written back in proportion over the next `residue_ramp_bytes`
(all at once where that is 0), under the tensor name RESIDUE, counted against the kernel.

`L2Sets` divides the capacity into hashed sets, each such a cache holding its share: a block is spread
over the sets in stripes (as a tile's lines are over the real L2's sets) and each stripe is replaced
within its set, so reuse at a distance near the capacity is kept in the sets that happen to hold less,
a share that falls gradually with the distance instead of all or nothing. `L2Mixture` runs several
caches side by side, of capacities either side of the effective one, and reports their mean.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterator, Mapping

import attrs

BlockKey = tuple[Hashable, ...]  # (tensor, ...) naming one block of one tensor
RESIDUE = "(flush residue)"  # the dirty lines a cold flush leaves behind, written back by the next kernel


@attrs.frozen
class L2Flow:
    """What the L2 did for one (kernel, tensor), in bytes."""

    hit_bytes: int = 0
    dram_read_bytes: int = 0
    dram_write_bytes: int = 0
    dirty_at_end_bytes: int = 0
    write_bytes: int = 0  # bytes the SMs wrote into the L2 (the logical writes)
    again_bytes: int = 0  # reads of data the logical ledger counted already (a GEMM's operand tiles read again)

    @property
    def read_bytes(self) -> int:
        """Bytes the SMs read through the L2 that the logical ledger counts: hits plus misses, less the reads
        again."""
        return self.hit_bytes + self.dram_read_bytes - self.again_bytes

    def __add__(self, other: L2Flow) -> L2Flow:
        return L2Flow(*(a + b for a, b in zip(attrs.astuple(self), attrs.astuple(other))))


@attrs.frozen(hash=False)
class PhysicalTraffic:
    """The L2's ledger of a run: L2Flow by (kernel, tensor), and its sums."""

    ledger: Mapping[tuple[str, str], L2Flow] = attrs.field(factory=dict)

    def _sum(self, key_index: int) -> dict[str, L2Flow]:
        grouped: dict[str, L2Flow] = {}
        for key, flow in self.ledger.items():
            grouped[key[key_index]] = grouped.get(key[key_index], L2Flow()) + flow
        return grouped

    @property
    def by_kernel(self) -> dict[str, L2Flow]:
        return self._sum(0)

    @property
    def by_tensor(self) -> dict[str, L2Flow]:
        return self._sum(1)


@attrs.define
class L2Cache:
    """An LRU, write-back, write-allocate cache of `capacity_bytes`, counting by (kernel, tensor).

    A block filled by a read miss holds `read_fill_weight` of its size until it is read again (a
    stream read once leaves less behind than data that is written or reused). In the kernels
    `kernel_read_weights` names, every read of a clean block holds that kernel's weight, filled or read
    again (a dirty block read holds its size, as anywhere).

    In the kernels `kernel_clean_age_factors` names, a clean block ages that many times slower than a
    dirty one: the victim is the least recently used dirty block unless the least recently used clean one
    is older by the factor (ages in bytes brought in since each was filled, written or read again). A
    GEMM writing its output around operand tiles it reads again keeps those tiles longer than least
    recently used order would (benchmarks/gpu/l2_probe/bands.txt).

    In the kernels `kernel_write_weights` names, a block written holds that share of its size: the L2 keeps
    less of what FA-2 writes (O) dirty at the kernel's end than O's size alone leaves room for beside the
    stream of K and V (benchmarks/gpu/l2_probe/fit_writes.txt).

    A dirty block a kernel reads (what an earlier kernel wrote for it) is written back once the kernel has read
    `dirty_read_window_bytes` more, and stays, clean: read beside a stream, dirty data goes back to DRAM far
    sooner than dirty data the kernel leaves alone (benchmarks/gpu/l2_probe/hints.txt). The window is the
    kernel's: what it read and has not yet passed is still dirty at its end."""

    capacity_bytes: float
    read_fill_weight: float = 1.0
    flush_residue_bytes: int = 0
    residue_ramp_bytes: float = 0.0
    cohort_weight: float = 1.0
    kernel_read_weights: Mapping[str, float] = attrs.field(factory=dict)
    kernel_clean_age_factors: Mapping[str, float] = attrs.field(factory=dict)
    kernel_write_weights: Mapping[str, float] = attrs.field(factory=dict)
    dirty_read_window_bytes: float | None = None
    kernel: str | None = None
    _blocks: OrderedDict[BlockKey, list] = attrs.field(factory=OrderedDict)  # key -> [nbytes, dirty, cost]
    _resident_cost: float = 0.0
    _flows: dict[tuple[str, str], list[int]] = attrs.field(factory=dict)
    _residue_left: int = 0  # bytes of the flush residue still dirty in the cache
    _filled: int = 0  # bytes brought in (read misses and writes, at full size) since the flush
    _touched: dict[BlockKey, int] = attrs.field(factory=dict)  # in an ageing kernel: _filled at a block's last touch
    _read: int = 0  # bytes the kernel has read since it first read a dirty block (where dirty reads have a window)
    _dirty_reads: deque[tuple[int, BlockKey]] = attrs.field(factory=deque)  # (_read at the read, key), oldest first

    def read(self, key: BlockKey, nbytes: int, count: int = 1, shared: bool = False, again: bool = False) -> None:
        """`count` back-to-back reads of a block (CTAs in lock-step): the first may miss, the rest hit. A
        block one CTA fills holds `read_fill_weight` of its size until it is read again, then all of it;
        a block a cohort reads (count > 1), or that several CTAs read at once though counted once
        (`shared`), holds `cohort_weight` of it. `again`: reads the logical ledger counted already."""
        flow = self._flows.get((self.kernel, key[0])) or self._flow(key[0])  # type: ignore[arg-type]  # _flow inlined: the hot path
        block = self._blocks.get(key)
        shared = shared or count > 1
        if again:
            flow[5] += nbytes * count
        dirty = block is not None and block[1]
        if self.dirty_read_window_bytes is not None and (dirty or self._dirty_reads):  # counted while one is pending
            self._through_window(self.dirty_read_window_bytes, key, nbytes * count, dirty)
        own_weight = self.kernel_read_weights.get(self.kernel)  # type: ignore[arg-type]
        if block is None:
            flow[1] += nbytes
            flow[0] += nbytes * (count - 1)
            fill = own_weight if own_weight is not None else self.cohort_weight if shared else self.read_fill_weight
            self._insert(key, nbytes, dirty=False, cost=nbytes * fill)
            return
        if block[1]:  # a dirty block read holds its size whatever the kernel: what the previous kernel wrote
            own_weight = None
        held = nbytes * (own_weight if own_weight is not None else self.cohort_weight if shared else 1.0)
        if held != block[2]:
            self._resident_cost += held - block[2]
            block[2] = held
        if not block[1]:  # a dirty block read keeps its place: what a kernel wrote for the next to read once
            self._blocks.move_to_end(key)
            self._touch(key)
        flow[0] += nbytes * count
        if self._resident_cost > self.capacity_bytes:
            self._evict()

    def write(self, key: BlockKey, nbytes: int) -> None:
        block = self._blocks.get(key)
        self._flow(key[0])[4] += nbytes
        held = nbytes * self.kernel_write_weights.get(self.kernel, 1.0)  # type: ignore[arg-type]
        if block is None:
            self._insert(key, nbytes, dirty=True, cost=held)
        else:
            self._resident_cost += held - block[2]
            block[0], block[1], block[2] = nbytes, True, held
            self._blocks.move_to_end(key)
            self._touch(key)
            self._evict()

    def end_kernel(self) -> None:
        """Record the dirty bytes still resident, by tensor, against the kernel that is ending."""
        for key, (nbytes, dirty, _) in self._blocks.items():
            if dirty:
                self._flow(key[0])[3] += nbytes
        self._dirty_reads.clear()
        self._read = 0
        self.kernel = None

    def flush(self, residue: bool = False) -> None:
        """Write back and invalidate everything, outside any kernel (no bytes are charged); with
        `residue`, as ncu's cache control does: `flush_residue_bytes` stay dirty, to be evicted later."""
        self._blocks.clear()
        self._touched.clear()
        self._residue_left = self.flush_residue_bytes if residue else 0
        self._resident_cost = self._residue_left
        self._filled = 0

    def traffic(self) -> PhysicalTraffic:
        return PhysicalTraffic({key: L2Flow(*flow) for key, flow in self._flows.items()})

    def _flow(self, tensor: Hashable) -> list[int]:
        flow = self._flows.get((self.kernel, tensor))  # type: ignore[arg-type]
        if flow is None:
            if self.kernel is None:
                raise RuntimeError(f"L2 access to {tensor!r} outside a kernel")
            flow = self._flows[self.kernel, str(tensor)] = [0, 0, 0, 0, 0, 0]
        return flow

    def _insert(self, key: BlockKey, nbytes: int, dirty: bool, cost: float) -> None:
        self._blocks[key] = [nbytes, dirty, cost]
        self._resident_cost += cost
        self._filled += nbytes
        self._touch(key)
        self._evict_residue()
        self._evict()

    def _touch(self, key: BlockKey) -> None:
        """In a kernel that ages clean blocks slower, remember when `key` was last filled, written or read again."""
        if self.kernel in self.kernel_clean_age_factors:
            self._touched[key] = self._filled

    def _through_window(self, window: float, key: BlockKey, nbytes: int, dirty: bool) -> None:
        """A read of `nbytes` (of a dirty block: it joins the window); the dirty blocks read more than `window`
        bytes ago are written back and stay, clean."""
        self._read += nbytes
        if dirty:
            self._dirty_reads.append((self._read, key))
        self._clean_behind(self._read - window)

    def _clean_behind(self, mark: float) -> None:
        """Write back the dirty blocks read before `mark` (in the window's count); they stay, clean."""
        while self._dirty_reads and self._dirty_reads[0][0] < mark:
            passed = self._dirty_reads.popleft()[1]
            block = self._blocks.get(passed)
            if block is not None and block[1]:
                self._write_back(passed)

    def _write_back(self, key: BlockKey) -> None:
        """Write a resident dirty block back; it stays, clean."""
        block = self._blocks[key]
        block[1] = False
        self._flow(key[0])[2] += block[0]

    def _evict_residue(self) -> None:
        """The residue leaves first, as soon as what came in since the flush, at full size, overflows the
        room beside it: a stream read once displaces it as much as data that stays."""
        if not self._residue_left:
            return
        room = self.capacity_bytes - self.flush_residue_bytes
        overflow = max(0.0, self._filled - room)
        share = min(1.0, overflow / self.residue_ramp_bytes) if self.residue_ramp_bytes else float(overflow > 0)
        written = int(share * self.flush_residue_bytes) - (self.flush_residue_bytes - self._residue_left)
        if written > 0:
            self._residue_left -= written
            self._resident_cost -= written
            self._flow(RESIDUE)[2] += written

    def _evict(self) -> None:
        if self._resident_cost <= self.capacity_bytes:
            return
        factor = self.kernel_clean_age_factors.get(self.kernel)  # type: ignore[arg-type]
        while self._resident_cost > self.capacity_bytes and self._blocks:
            if factor is None:
                key, (nbytes, dirty, cost) = self._blocks.popitem(last=False)
            else:
                key = self._elder(factor)
                nbytes, dirty, cost = self._blocks.pop(key)
                self._touched.pop(key, None)
            self._resident_cost -= cost
            if dirty:
                self._flow(key[0])[2] += nbytes

    def _elder(self, factor: float) -> BlockKey:
        """The least recently used dirty block, or the least recently used clean one where its age over
        `factor` is the greater (a block untouched in this kernel is the oldest)."""
        dirty = clean = None
        for key, block in self._blocks.items():
            if block[1] and dirty is None:
                dirty = key
            elif not block[1] and clean is None:
                clean = key
            if dirty is not None and clean is not None:
                break
        if dirty is None or clean is None:
            return next(iter(self._blocks))
        dirty_age, clean_age = (self._filled - self._touched.get(key, 0) for key in (dirty, clean))
        return clean if clean_age / factor > dirty_age else dirty


@attrs.define
class _CacheGroup:
    """Several LRU caches that together are one L2: the kernel name, the end of a kernel and the flush go to all."""

    caches: tuple[L2Cache, ...]

    @property
    def kernel(self) -> str | None:
        return self.caches[0].kernel

    @kernel.setter
    def kernel(self, name: str | None) -> None:
        for cache in self.caches:
            cache.kernel = name

    def end_kernel(self) -> None:
        for cache in self.caches:
            cache.end_kernel()

    def flush(self, residue: bool = False) -> None:
        for cache in self.caches:
            cache.flush(residue)


@attrs.define
class L2Mixture(_CacheGroup):
    """The L2 as an equal mixture of LRU caches of different capacities, each seeing every transfer; its
    DRAM bytes are their mean. One effective capacity makes reuse all or nothing: data reused at a
    distance just under it always hits, just over it always misses. The real L2 (hashed sets, two
    partitions, CTAs that drift) keeps a share of it; averaging caches a little smaller and a little
    larger than the centre gives that share (half, for data reused between the two)."""

    @property
    def capacity_bytes(self) -> float:
        return sum(c.capacity_bytes for c in self.caches) / len(self.caches)

    def read(self, key: BlockKey, nbytes: int, count: int = 1, shared: bool = False, again: bool = False) -> None:
        for cache in self.caches:
            cache.read(key, nbytes, count, shared, again)

    def write(self, key: BlockKey, nbytes: int) -> None:
        for cache in self.caches:
            cache.write(key, nbytes)

    def traffic(self) -> PhysicalTraffic:
        """The caches' mean flows (bytes floored); the logical bytes are every cache's, so hits are the
        logical reads less the mean DRAM reads."""
        ledgers = [cache.traffic().ledger for cache in self.caches]
        mean = {}
        for key in dict.fromkeys(key for ledger in ledgers for key in ledger):
            # a tensor the SMs touched has a flow in every cache; the flush residue only where it was evicted
            flows = [ledger.get(key, L2Flow()) for ledger in ledgers]
            read, written = max(f.read_bytes for f in flows), max(f.write_bytes for f in flows)
            again = max(f.again_bytes for f in flows)
            dram_read = sum(f.dram_read_bytes for f in flows) // len(flows)
            mean[key] = L2Flow(read + again - dram_read, dram_read,
                               sum(f.dram_write_bytes for f in flows) // len(flows),
                               sum(f.dirty_at_end_bytes for f in flows) // len(flows), written, again)
        return PhysicalTraffic(mean)


@attrs.define
class L2Sets(_CacheGroup):
    """The L2 as hashed sets: `caches`, each an equal share of the capacity. A block is cut into stripes of at
    most `stripe_bytes`, each placed in a set by a hash of its key (CRC-32: the same on every run), and
    replaced there; the flows are the sets' sums. One capacity whose sets fill unevenly: data reused at a
    distance near the capacity survives in the sets that happen to hold less."""

    stripe_bytes: int
    _set_of: dict[BlockKey, L2Cache] = attrs.field(factory=dict)

    @property
    def capacity_bytes(self) -> float:
        return sum(c.capacity_bytes for c in self.caches)

    def read(self, key: BlockKey, nbytes: int, count: int = 1, shared: bool = False, again: bool = False) -> None:
        for cache, stripe, size in self._stripes(key, nbytes):
            cache.read(stripe, size, count, shared, again)

    def write(self, key: BlockKey, nbytes: int) -> None:
        for cache, stripe, size in self._stripes(key, nbytes):
            cache.write(stripe, size)

    def traffic(self) -> PhysicalTraffic:
        total: dict[tuple[str, str], L2Flow] = {}
        for cache in self.caches:
            for key, flow in cache.traffic().ledger.items():
                total[key] = total.get(key, L2Flow()) + flow
        return PhysicalTraffic(total)

    def _stripes(self, key: BlockKey, nbytes: int) -> Iterator[tuple[L2Cache, BlockKey, int]]:
        """(set, stripe key, bytes) of each stripe of a block: the stripe key extends the block's, so its
        first element still names the tensor."""
        count = -(-nbytes // self.stripe_bytes)
        for i in range(count):
            stripe = (*key, i)
            cache = self._set_of.get(stripe)
            if cache is None:
                cache = self._set_of[stripe] = self.caches[zlib.crc32(repr(stripe).encode()) % len(self.caches)]
            yield cache, stripe, nbytes // count + (i < nbytes % count)


L2 = L2Cache | L2Mixture | L2Sets  # what the grid runner, the HBM and the models pass transfers to
