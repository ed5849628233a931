"""Variants of the L2 model (simflash.l2), tried against the probe (probe.json) and the whole-chip sweeps:
the scores docs/physical.md quotes for them (kept, of those: the Q K GEMM's read fills at 0, `fills:gemm_qk=0`,
now the machine file's `l2_gemm_qk_read_weight`, and clean blocks ageing 1.4 times slower in that GEMM, with its
tiles walked as cuBLAS walks them, `l2_gemm_qk_clean_age_factor`, and the P V GEMM's chunks of V read as a
cohort's only from heads of four CTAs' tiles, `pv-shared-v-4`, now simflash.algorithms.naive.PV_SHARED_V_TILES;
each variant here is a change to the model as it stands).

    python benchmarks/gpu/l2_probe/variants.py [VARIANT | fills:KERNEL=WEIGHT,... | writes:KERNEL=WEIGHT,... ...]
                                                [--sweeps] [--sdpa] [--probe-rows] [--heads] [--naive]
                                                [--flash | --fa2] [--retention] [--bands] [--hints]

Per variant: the probe's kernel rows predicted (DRAM bytes read and written, within 10% / 1 MiB, and the
absolute error in MiB), and the calibration sweep's fit rows within 10% / 1 MiB (naive and simflash's
FA-2 kernel, reads and writes, cold and warm: 256 in all), as the model's own figures were chosen. With
--sweeps, every other sweep's rows too (run only after a variant has been judged on the fit rows); with
--sdpa, PyTorch SDPA's FA-2 rows beside them; with --probe-rows, each probe kernel's DRAM MiB read and
written, predicted / measured. A variant with `pv_tiles` also plays the naive path's P V GEMM as
pv_tiles.py lays it out. With --heads, the heads probe's causal grids at d = 128 (sdpa_kv_order/heads.json):
DRAM MiB read beyond Q + K + V per head, predicted / measured. With --retention, the retention probe's
rotated readers (retention.json) replayed in lock-step: the share of their re-reads that miss, predicted /
measured. With --bands, only the bands probe (bands.json) replayed in lock-step: the DRAM MiB read beyond
the compulsory, predicted / measured. With --hints, only the hints probe's plain reads (hints.json: a dirty W
read beside a fresh R) and probe.py's R read alone after W, replayed: MiB of W written back, predicted /
measured. With --naive, only the naive path's rows
no figure was fitted on (the eight sweeps less the calibration fit set), by kernel, cold and warm; with
--flash, those rows of simflash's FA-2 kernel and PyTorch SDPA's (--fa2: simflash's alone); with any of them
and --probe-rows, each of
those rows' DRAM MiB read and written, measured / predicted.
"""

import json
import random
import sys
from itertools import islice
from collections import OrderedDict
from multiprocessing import Pool
from pathlib import Path

import attrs

import bands
import hints
import pv_tiles
import simflash.algorithms.naive as naive_algorithm
import simflash.chip as chip
import simflash.grid as grid
import simflash.model.physical as physical
from simflash.chip import kernel_figures
from simflash.config import MiB, gpu_spec
from simflash.l2 import RESIDUE, L2Cache, L2Mixture, L2Sets
from simflash.model.calibration import KERNEL_OF, REGIME_SWEEPS, compare, load

HERE = Path(__file__).resolve().parent
SWEEP_FOLDER = HERE.parent
RESIDUE_BLOCK = 64 * 1024
PROBE_BLOCK = 256 * 1024


@attrs.define
class L2Variant(L2Cache):
    """L2Cache with these switches: dirty bytes capped at `dirty_limit` (beyond it the least recently used
    dirty blocks are written back and stay, clean); dirty blocks holding `dirty_weight` of their size; the
    cold flush's residue as dirty blocks at the least-recently-used end (in place of the ramp);
    `dirty_read_renews`: a read of a dirty block moving it to the most recently used end, as a clean one
    (the model leaves it in place); `shared_rereads`: a clean block read again, by any CTA at any step,
    holding the cohort weight (data several SMs read) rather than only when a cohort reads it in one step;
    `reread_floor`: once the cache has evicted, that share of a clean block's hit by one CTA (a re-read)
    misses, as if the replacement sometimes picked live lines (SDPA's causal floor, floor.py);
    `victim_window`: the block evicted drawn at random (seeded) among that many least recently used, and
    `kernel_victim_windows` in the kernels it names; `dirty_read_weight`: the share of its size a dirty block
    read holds; `reread_weight`: the share a clean block read again by one CTA holds (1: all of it);
    `dirty_read_demotes`: a read of a dirty block moving it to the least recently used end (evicted next);
    `stale_random`: the blocks an earlier kernel left, until this one writes them or reads them clean, evicted
    before any other and in random order (seeded), in the kernels `stale_kernels` names (every kernel where
    empty); `random_victim_share`: on each eviction, with that probability the victim is a block drawn
    uniformly (seeded) from the whole set rather than the least recently used one (with `random_victim_clean`,
    from its clean blocks only); `stale_shed_kernels`: in those kernels, a block filled while the cache is full
    takes up to its full size, the room beyond its weight evicted at random from the blocks an earlier kernel left,
    `stale_shed_rate` x their share of the cache x its size (with `stale_shed_latched`, from the kernel's first
    eviction on, the fill not growing; with `stale_shed_dead_only`, only clean stale blocks and dirty ones this
    kernel has read)."""

    dirty_limit: float = float("inf")
    dirty_weight: float = 1.0
    residue_blocks: bool = False
    dirty_read_renews: bool = False
    shared_rereads: bool = False
    reread_floor: float = 0.0
    victim_window: int = 1
    kernel_victim_windows: dict = attrs.field(factory=dict)
    dirty_read_weight: float = 1.0
    reread_weight: float = 1.0
    dirty_read_demotes: bool = False
    demote_kernels: tuple = ()  # with dirty_read_demotes: only in these kernels (all where empty)
    stale_random: bool = False
    stale_kernels: tuple = ()  # with stale_random: only in these kernels (all where empty)
    clean_age_factor: float = 1.0  # a clean block ages this many times slower than a dirty one when they vie
    clean_age_on_writes: bool = False  # with clean_age_factor: only where a write makes the room
    clean_age_kernels: tuple = ()  # with clean_age_factor: only in these kernels (all where empty)
    random_victim_share: float = 0.0  # on each eviction, this share of the time the victim is a block drawn at random
    random_victim_clean: bool = False  # with random_victim_share: only clean blocks drawn (the LRU one where none is)
    clean_tail: float = 0.0  # dirty blocks within this many bytes of the least recently used end are written back, kept clean
    stale_shed_kernels: tuple = ()  # in these kernels, a fill while full takes room from what an earlier kernel left
    stale_shed_rate: float = 1.0  # with stale_shed_kernels: the share of a fill's size times the stale share shed
    stale_shed_latched: bool = False  # with stale_shed_kernels: from the kernel's first eviction on, the fill not growing
    stale_shed_dead_only: bool = False  # with stale_shed_kernels: only clean stale blocks, and dirty ones once read here
    _evicted_here: bool = False  # whether the cache has evicted in this kernel
    _dead: list = attrs.field(factory=list)  # with stale_shed_dead_only: the stale blocks that may be shed
    _dead_set: set = attrs.field(factory=set)
    _stale_bytes: int = 0  # bytes of the blocks in _stale
    _shed_owed: float = 0.0  # bytes of stale blocks a fill has yet to evict
    _writing: bool = False
    _clock: int = 0  # bytes brought in (fills and writes): the age a block's last touch is told by
    _touched: dict = attrs.field(factory=dict)  # key -> _clock at its insertion or last move to the end
    _stale: set = attrs.field(factory=set)  # blocks an earlier kernel left and this one has not renewed
    _stale_order: list = attrs.field(factory=list)  # them, shuffled: the order they are evicted in
    _evicting: bool = False
    _random: random.Random = attrs.field(factory=lambda: random.Random(0))
    _dirty: OrderedDict = attrs.field(factory=OrderedDict)  # dirty keys, least recently used first
    _dirty_bytes: int = 0

    def read(self, key, nbytes, count=1, shared=False, again=False):
        if key not in self._blocks:
            MISSED[0] += nbytes
        if key in self._stale and not self._blocks[key][1]:  # a clean block read again is this kernel's
            self._stale.discard(key)
            self._stale_bytes -= self._blocks[key][0]
        block = self._blocks.get(key)
        if block is None or not (block[1] or self.shared_rereads or self.reread_weight != 1.0):
            flow = self._flow(key[0])
            hits = flow[0]
            if block is None:
                self._clock += nbytes
            self._touched[key] = self._clock  # filled, or a clean block moved to the end
            super().read(key, nbytes, count, shared, again)
            if block is None:
                self._shed_stale(key, nbytes)
            if block is not None and count == 1 and self._evicting and self.reread_floor:
                missed = round(nbytes * self.reread_floor)
                flow[0] = hits + nbytes - missed
                flow[1] += missed
            return
        if again:
            self._flow(key[0])[5] += nbytes * count
        if self.dirty_read_window_bytes is not None and (block[1] or self._dirty_reads):  # reads L2Cache.read misses
            self._through_window(self.dirty_read_window_bytes, key, nbytes * count, block[1])
        if not block[1]:  # a clean block read again: data several SMs read
            held = nbytes * (self.cohort_weight if self.shared_rereads or count > 1 or shared else self.reread_weight)
            self._resident_cost += held - block[2]
            block[2] = held
            self._flow(key[0])[0] += nbytes * count
            self._blocks.move_to_end(key)
            self._touched[key] = self._clock
            self._evict()
            return
        if self.stale_shed_dead_only and key in self._stale and key not in self._dead_set:
            self._dead.append(key)  # a dirty block the kernel has read: dead, it may be shed
            self._dead_set.add(key)
        held = nbytes * self.dirty_weight * self.dirty_read_weight * (self.cohort_weight if count > 1 or shared else 1.0)
        self._resident_cost += held - block[2]
        block[2] = held
        self._flow(key[0])[0] += nbytes * count
        if self.dirty_read_renews:
            self._blocks.move_to_end(key)
            self._dirty.move_to_end(key)
        elif self.dirty_read_demotes and (not self.demote_kernels or self.kernel in self.demote_kernels):
            self._blocks.move_to_end(key, last=False)
            if key in self._dirty:
                self._dirty.move_to_end(key, last=False)
        self._evict()

    def write(self, key, nbytes):
        if key in self._stale:
            self._stale.discard(key)
            self._stale_bytes -= self._blocks[key][0]
        self._flow(key[0])[4] += nbytes
        block = self._blocks.pop(key, None)
        if block is not None:
            self._resident_cost -= block[2]
            self._forget_dirty(key)
        held = nbytes * self.kernel_write_weights.get(self.kernel, self.dirty_weight)
        self._blocks[key] = [nbytes, True, held]
        self._clock += nbytes
        self._touched[key] = self._clock
        self._resident_cost += held
        self._dirty[key] = nbytes
        self._dirty_bytes += nbytes
        if block is None:
            self._filled += nbytes
            self._evict_residue()
        self._clean()
        self._writing = True
        self._evict()
        self._writing = False
        if block is None:
            self._shed_stale(key, nbytes)

    def end_kernel(self):
        super().end_kernel()
        self._evicted_here = False
        if self.stale_random or self.stale_shed_kernels:  # what this kernel leaves, the next evicts in no order of its own
            self._stale = set(self._blocks)
            self._stale_bytes = sum(block[0] for block in self._blocks.values())
            self._stale_order = list(self._blocks)
            self._random.shuffle(self._stale_order)
            self._shed_owed = 0.0
            if self.stale_shed_dead_only:
                self._dead = [key for key, block in self._blocks.items() if not block[1]]
                self._dead_set = set(self._dead)

    def _shed_stale(self, key, nbytes):
        """In a shedding kernel, a block filled while the cache is full takes up to its full size, the room evicted
        from the stale blocks (what an earlier kernel left), drawn at random, their share of the cache times its
        size: what an earlier kernel left goes at a pace the misses set, whatever its place."""
        block = self._blocks.get(key)
        if self.kernel not in self.stale_shed_kernels or not self._stale_bytes or block is None:
            return
        if self.stale_shed_latched:
            if not self._evicted_here:
                return
            self._shed_owed += self.stale_shed_rate * nbytes * self._stale_bytes / self.capacity_bytes
        elif self._resident_cost < self.capacity_bytes - nbytes:
            return
        else:
            self._shed_owed += min(nbytes - block[2],
                                   self.stale_shed_rate * nbytes * self._stale_bytes / self.capacity_bytes)
        candidates = self._dead if self.stale_shed_dead_only else self._stale_order
        while self._shed_owed > 0 and candidates:
            if self.stale_shed_dead_only:  # drawn at random: swapped to the end, then taken
                i = self._random.randrange(len(candidates))
                candidates[i], candidates[-1] = candidates[-1], candidates[i]
            victim = candidates.pop()
            if victim not in self._stale:
                continue
            size, dirty, cost = self._blocks.pop(victim)
            self._stale.discard(victim)
            self._stale_bytes -= size
            self._shed_owed -= size
            self._resident_cost -= cost
            grown = 0.0 if self.stale_shed_latched else min(cost, nbytes - block[2])
            block[2] += grown
            self._resident_cost += grown
            if dirty:
                self._flow(victim[0])[2] += size
                self._forget_dirty(victim)

    def flush(self, residue=False):
        super().flush(residue and not self.residue_blocks)
        self._stale.clear()
        self._stale_order.clear()
        self._stale_bytes = 0
        self._evicting = False
        self._dirty.clear()
        self._dirty_bytes = 0
        if residue and self.residue_blocks:
            for i, start in enumerate(range(0, self.flush_residue_bytes, RESIDUE_BLOCK)):
                nbytes = min(RESIDUE_BLOCK, self.flush_residue_bytes - start)
                self._blocks[RESIDUE, i] = [nbytes, True, nbytes]
                self._resident_cost += nbytes
                self._dirty[RESIDUE, i] = nbytes
                self._dirty_bytes += nbytes

    def _forget_dirty(self, key):
        self._dirty_bytes -= self._dirty.pop(key, 0)

    def _write_back(self, key):
        super()._write_back(key)
        self._forget_dirty(key)

    def _clean(self):
        while self._dirty_bytes > self.dirty_limit:
            key, nbytes = self._dirty.popitem(last=False)
            self._dirty_bytes -= nbytes
            block = self._blocks[key]
            self._resident_cost += nbytes - block[2]  # clean, it holds its full size
            block[1], block[2] = False, nbytes
            self._flow(key[0])[2] += nbytes

    def _evict(self):
        self._evict_lru()
        if self.clean_tail:
            self._clean_tail()

    def _clean_tail(self):
        """Write back the dirty blocks among the least recently used `clean_tail` bytes; they stay, clean."""
        held = 0.0
        for key, block in self._blocks.items():
            if held >= self.clean_tail:
                break
            held += block[2]
            if block[1]:
                block[1] = False
                self._flow(key[0])[2] += block[0]
                self._forget_dirty(key)

    def _evict_lru(self):
        while self._resident_cost > self.capacity_bytes and self._blocks:
            self._evicting = self._evicted_here = True
            window = self.kernel_victim_windows.get(self.kernel, self.victim_window)
            key = None
            while self.stale_random and self._stale_order and key is None and (
                    not self.stale_kernels or self.kernel in self.stale_kernels):
                candidate = self._stale_order.pop()
                key = candidate if candidate in self._stale else None
            if key is None and self.clean_age_factor != 1.0 and self._dirty and (
                    self._writing or not self.clean_age_on_writes) and (
                    not self.clean_age_kernels or self.kernel in self.clean_age_kernels):
                key = self._elder()
            if key is None and self.random_victim_share and self._random.random() < self.random_victim_share:
                key = self._random_victim()
            if key is not None:
                nbytes, dirty, cost = self._blocks.pop(key)
            elif window > 1:
                oldest = list(islice(self._blocks, window))
                key = oldest[self._random.randrange(len(oldest))]
                nbytes, dirty, cost = self._blocks.pop(key)
            else:
                key, (nbytes, dirty, cost) = self._blocks.popitem(last=False)
            if key in self._stale:
                self._stale.discard(key)
                self._stale_bytes -= nbytes
            self._resident_cost -= cost
            if dirty:
                self._flow(key[0])[2] += nbytes
                self._forget_dirty(key)


    def _random_victim(self):
        """A block drawn uniformly from the whole set (with random_victim_clean, from its clean blocks; None
        where it has none: the least recently used one goes)."""
        if self.random_victim_clean:
            clean = [key for key, block in self._blocks.items() if not block[1]]
            return clean[self._random.randrange(len(clean))] if clean else None
        return next(islice(self._blocks, self._random.randrange(len(self._blocks)), None))

    def _elder(self):
        """The least recently used dirty block or clean one, whichever is the older once the clean one's age is
        divided by clean_age_factor."""
        dirty = next(iter(self._dirty))
        clean = next((key for key, block in self._blocks.items() if not block[1]), None)
        if clean is None:
            return dirty
        age = self._clock - self._touched.get(dirty, 0), (self._clock - self._touched.get(clean, 0)) / self.clean_age_factor
        return dirty if age[0] >= age[1] else clean


MODEL_PV_SHARED_V_TILES = naive_algorithm.PV_SHARED_V_TILES
MODEL_SOFTMAX_RESIDENT_ROWS = physical.softmax_resident_rows
MODEL_GEMM_TILE_ROWS = naive_algorithm.GEMM_TILE_ROWS
MISSED = [0]  # bytes filled by read misses so far, in any L2Variant (what the paced schedule tells a step by)
_model_run_programs = physical.run_programs


def paced_run_programs(pace: float):
    """simflash.grid.run_programs for FA-2's kernel with each cohort at its own pace: a step takes 1 + pace x f time
    steps, f the bytes that missed in the L2 in it (a first step's Q too) over the bytes its stream reads (one
    member's, where the cohort only streams), so readers that hit catch up with the one ahead that misses and the
    L2 sees them in the order that gives (convoys, as the rotated readers of rotated_timing.py form); `pace` 0 is
    the model's lock-step. Other kernels keep the lock-step."""

    def run(programs, slots, l2):
        if l2.kernel != "flash2_forward":
            return _model_run_programs(programs, slots, l2)
        pending, units, resident, ticks, time = iter(programs), [], 0, [], 0
        while True:
            starting = {}
            while resident < slots and (program := next(pending, None)) is not None:
                unit = starting.get(program.cta.cohort)
                if unit is None:  # [step, members, time of its next step]
                    unit = starting[program.cta.cohort] = [0, [], float(time)]
                    units.append(unit)
                unit[1].append(program)
                resident += 1
            if not units:
                return ticks
            ticks.append(resident)
            for unit in units:
                step, members, due = unit
                if due > time:
                    continue
                streaming = step > 0 and all(step < m.cta.n_steps for m in members)
                reading = members[:1] if streaming else [m for m in members if step < m.cta.n_steps]
                wanted = sum(a.nbytes for m in reading for a in m.stream(step) if not a.write)
                before = MISSED[0]
                grid._play_step(step, members, streaming, l2)
                unit[0], unit[2] = step + 1, due + 1 + pace * ((MISSED[0] - before) / wanted if wanted else 0.0)
                unit[1] = [m for m in members if m.cta.n_steps > step]
                resident -= len(members) - len(unit[1])
            units = [u for u in units if u[1]]
            time += 1

    return run


CLOCK = [0]  # time steps of the lock-step schedule played so far (what L2Levels tells a later hit by)
_lockstep = grid.lockstep


def _ticking_lockstep(*args, **kwargs):
    for time, cohorts in _lockstep(*args, **kwargs):
        CLOCK[0] += 1
        yield time, cohorts


@attrs.define
class L2Levels(L2Cache):
    """A segmented LRU of several levels beside the model's cache (level 0): a clean block found again at a later
    time step than its last read goes up one level (from the model's cache to level 1, from level j to j + 1,
    up to the last), to that level's most recent end; a level over its share (`level_bytes[j - 1]`) sends its
    least recently used block down one level; only level 0 evicts. A line read again and again climbs and
    stays, one read a few times stays low. With one level, a segmented LRU: data re-read often (SDPA's causal
    K and V, a tile every few steps) stays longer than a stream read once or a cohort's tile read once a wave."""

    level_bytes: tuple = ()
    single_climbs: bool = False  # only reads by one CTA (not a cohort's, not shared) climb
    _levels: list = attrs.field(factory=list)  # level j (1..) at [j - 1]: key -> [nbytes, cost]
    _level_costs: list = attrs.field(factory=list)
    _level_of: dict = attrs.field(factory=dict)  # key -> its level, for blocks above level 0
    _seen: dict = attrs.field(factory=dict)  # key -> time step of its last read

    def __attrs_post_init__(self):
        self._levels = [OrderedDict() for _ in self.level_bytes]
        self._level_costs = [0.0 for _ in self.level_bytes]

    def read(self, key, nbytes, count=1, shared=False):
        now, last = CLOCK[0], self._seen.get(key)
        self._seen[key] = now
        level = self._level_of.get(key)
        if level is not None:
            self._flow(key[0])[0] += nbytes * count
            if last != now and level < len(self.level_bytes) and self._climbs(count, shared):
                size, cost = self._take(level, key)
                self._put(level + 1, key, size, cost)
            else:
                self._levels[level - 1].move_to_end(key)
            return
        block = self._blocks.get(key)
        if block is None or block[1] or last is None or last == now or not self._climbs(count, shared):
            super().read(key, nbytes, count, shared)
            return
        del self._blocks[key]
        self._resident_cost -= block[2]
        self._flow(key[0])[0] += nbytes * count
        self._put(1, key, nbytes, nbytes * (self.cohort_weight if count > 1 or shared else 1.0))

    def _climbs(self, count, shared):
        return not (self.single_climbs and (count > 1 or shared))

    def _take(self, level, key):
        size, cost = self._levels[level - 1].pop(key)
        self._level_costs[level - 1] -= cost
        del self._level_of[key]
        return size, cost

    def _put(self, level, key, nbytes, cost):
        self._levels[level - 1][key] = [nbytes, cost]
        self._level_costs[level - 1] += cost
        self._level_of[key] = level
        while self._level_costs[level - 1] > self.level_bytes[level - 1]:
            demoted = next(iter(self._levels[level - 1]))
            size, held = self._take(level, demoted)
            if level > 1:
                self._put(level - 1, demoted, size, held)
            else:
                self._blocks[demoted] = [size, False, held]
                self._resident_cost += held
                self._evict()

    def write(self, key, nbytes):
        level = self._level_of.get(key)
        if level is not None:
            self._take(level, key)
        super().write(key, nbytes)

    def flush(self, residue=False):
        super().flush(residue)
        self.__attrs_post_init__()
        self._level_of.clear()
        self._seen.clear()


@attrs.define
class L2Dueling(L2Cache):
    """Dynamic insertion (an LRU cache that, when its lines thrash, inserts most read fills at the least
    recently used end): leader sets always insert at the most recent end (`role` "lru") or bimodally ("bip":
    one fill in `throttle` at the most recent end, the others at the least recent), and their read misses
    move a counter shared by all sets (`duel[0]`, 0 to 1023) up or down; the other sets ("follow") insert
    bimodally while the LRU leaders miss more. Writes always allocate at the most recent end. A working set
    larger than the cache then keeps part of itself instead of none, and only once the leaders have told
    the difference (the retention probe's misses come early)."""

    role: str = "follow"
    duel: list = attrs.field(factory=lambda: [512, 0])  # [counter, fills since the last one at the MRU end]
    throttle: int = 32

    def read(self, key, nbytes, count=1, shared=False):
        missed = key not in self._blocks
        super().read(key, nbytes, count, shared)
        if not missed:
            return
        if self.role == "lru":
            self.duel[0] = min(1023, self.duel[0] + 1)
        elif self.role == "bip":
            self.duel[0] = max(0, self.duel[0] - 1)
        if self.role == "bip" or (self.role == "follow" and self.duel[0] > 512):
            self.duel[1] += 1
            if self.duel[1] % self.throttle and key in self._blocks:
                self._blocks.move_to_end(key, last=False)

    def flush(self, residue=False):
        super().flush(residue)
        self.duel[:] = [512, 0]


@attrs.define
class L2RRIP(L2Cache):
    """Re-reference interval prediction in place of LRU: each block carries a prediction from 0 (read again
    soon) to 3 (not soon); a read fill comes in at 2, or with `bimodal` at 3 but one fill in 32 at 2; a hit
    or a write sets it to 0; the victim is the oldest block at 3, all predictions growing by one until one
    is. Lines read again get kept and a stream larger than the cache keeps a part of itself; which part, the
    hits decide over time."""

    bimodal: bool = False
    _prediction: dict = attrs.field(factory=dict)
    _fills: int = 0

    def read(self, key, nbytes, count=1, shared=False):
        if key in self._blocks:
            super().read(key, nbytes, count, shared)
            self._prediction[key] = 0
            return
        self._fills += 1
        self._prediction[key] = 3 if self.bimodal and self._fills % 32 else 2
        super().read(key, nbytes, count, shared)

    def write(self, key, nbytes):
        self._prediction[key] = 0
        super().write(key, nbytes)

    def _evict(self):
        while self._resident_cost > self.capacity_bytes and self._blocks:
            victim = next((k for k in self._blocks if self._prediction.get(k, 3) >= 3), None)
            if victim is None:
                for k in self._blocks:
                    self._prediction[k] = self._prediction.get(k, 3) + 1
                continue
            nbytes, dirty, cost = self._blocks.pop(victim)
            self._resident_cost -= cost
            if dirty:
                self._flow(victim[0])[2] += nbytes


# The machine file's model (hashed sets), then each variant's changes to it (capacities in MiB: one with `sets`,
# hashed sets of it; several without, the mixture of them the model used before its sets, as "mixture").
MIXTURE = (26.0, 31.0)  # the capacities (MiB) the model averaged before its sets, under which the variants naming it were judged
VARIANTS = {
    "current": {},
    "mixture": dict(capacities=MIXTURE),
    "probe": dict(capacities=(38, 44, 50, 56), read_fill_weight=1.0, cohort_weight=1.6, dirty_limit=28.2,
                  residue_blocks=True),
    "cap-on-fitted": dict(capacities=(27.5, 32.5), read_fill_weight=0.65, cohort_weight=1.0, dirty_weight=0.65,
                          dirty_limit=28.2, residue_blocks=True),
    "dirty-weight-0.7": dict(capacities=MIXTURE, dirty_weight=0.7),
    "dirty-weight-0.9": dict(capacities=MIXTURE, dirty_weight=0.9),
    "dirty-cap-14": dict(capacities=MIXTURE, dirty_limit=14.0),
    "dirty-cap-20": dict(capacities=MIXTURE, dirty_limit=20.0),
    "mixture-3": dict(capacities=(23.5, 28.5, 33.5)),
    "mixture-5": dict(capacities=(26, 28.5, 31, 33.5, 36)),
    "probe-shared": dict(capacities=(38, 44, 50, 56), read_fill_weight=1.0, cohort_weight=1.6, dirty_limit=28.2,
                         residue_blocks=True, shared_rereads=True),
    "probe-shared-pv-tiles": dict(capacities=(38, 44, 50, 56), read_fill_weight=1.0, cohort_weight=1.6,
                                  dirty_limit=28.2, residue_blocks=True, shared_rereads=True, pv_tiles=True),
    "current-pv-tiles": dict(capacities=MIXTURE, pv_tiles=True),
    "reread-floor": dict(capacities=MIXTURE, reread_floor=0.013),
    "sets-28.5-57": dict(capacities=(28.5,), sets=57, stripe_kib=16),
    "sets-32-114": dict(capacities=(32,), sets=114, stripe_kib=16),
    "sets-28.5-114": dict(capacities=(28.5,), sets=114, stripe_kib=16),
    "sets-30-57": dict(capacities=(30,), sets=57, stripe_kib=16),
    "sets-29-57": dict(capacities=(29,), sets=57, stripe_kib=16),
    "sets-28-57": dict(capacities=(28,), sets=57, stripe_kib=16),
    "sets-27.5-57": dict(capacities=(27.5,), sets=57, stripe_kib=16),
    "dirty-read-renews": dict(dirty_read_renews=True),
    "pv-tiles": dict(pv_tiles=True),
    "fill-0.5": dict(read_fill_weight=0.5),
    "fill-0.1": dict(read_fill_weight=0.1),
    "random-victim-8": dict(victim_window=8),
    "random-victim-32": dict(victim_window=32),
    # on each eviction, with probability p a block drawn at random from the whole set, else the LRU one (seeded);
    # `-clean`: only clean blocks drawn
    **{f"random-share-{p}": dict(random_victim_share=p) for p in (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)},
    "random-share-0.2-clean": dict(random_victim_share=0.2, random_victim_clean=True),
    "pv-fill-1": dict(kernel_read_weights={"gemm_pv": 1.0}),
    "pv-fill-0.6": dict(kernel_read_weights={"gemm_pv": 0.6}),
    "qk-fill-0.1": dict(kernel_read_weights={"gemm_qk": 0.1}),
    "qk-fill-0": dict(kernel_read_weights={"gemm_qk": 0.0}),
    "stripes-8": dict(stripe_kib=8),
    "stripes-4": dict(stripe_kib=4),
    "dirty-read-1.1": dict(dirty_read_weight=1.1),
    "dirty-read-1.25": dict(dirty_read_weight=1.25),
    "dirty-read-1.5": dict(dirty_read_weight=1.5),
    "dirty-read-demotes": dict(dirty_read_demotes=True),
    "qk-fill-0-demotes": dict(dirty_read_demotes=True, kernel_read_weights={"gemm_qk": 0.0}),
    "qk-fill-0-softmax-demotes": dict(dirty_read_demotes=True, demote_kernels=("softmax",),
                                      kernel_read_weights={"gemm_qk": 0.0}),
    "qk-fill-0-pv-demotes": dict(dirty_read_demotes=True, demote_kernels=("gemm_pv",),
                                 kernel_read_weights={"gemm_qk": 0.0}),
    "demotes-pv-fill-1": dict(dirty_read_demotes=True, kernel_read_weights={"gemm_pv": 1.0}),
    "demotes-pv-fill-0.75": dict(dirty_read_demotes=True, kernel_read_weights={"gemm_pv": 0.75}),
    "demotes-pv-fill-0.5": dict(dirty_read_demotes=True, kernel_read_weights={"gemm_pv": 0.5}),
    # only in the P V GEMM: what it reads of P goes next, and its fills hold W (the softmax's demotion as before)
    **{f"pv-demotes-fill-{w}": dict(dirty_read_demotes=True, demote_kernels=("gemm_pv",),
                                    kernel_read_weights={"gemm_pv": w}) for w in (0.5, 0.6)},
    "pv-random-fill-1": dict(kernel_read_weights={"gemm_pv": 1.0}, kernel_victim_windows={"gemm_pv": 64}),
    "pv-random-fill-0.75": dict(kernel_read_weights={"gemm_pv": 0.75}, kernel_victim_windows={"gemm_pv": 64}),
    "pv-random-16-fill-1": dict(kernel_read_weights={"gemm_pv": 1.0}, kernel_victim_windows={"gemm_pv": 16}),
    "sets-32-dirty-27": dict(capacities=(32,), dirty_limit=27),
    "sets-36-dirty-28": dict(capacities=(36,), dirty_limit=28),
    "reread-0.5": dict(reread_weight=0.5),
    "reread-0.7": dict(reread_weight=0.7),
    "reread-0.8": dict(reread_weight=0.8),
    "stale-random": dict(stale_random=True),
    "stale-random-pv-fill-0.5": dict(stale_random=True, kernel_read_weights={"gemm_pv": 0.5}),
    "stale-random-in-pv": dict(stale_random=True, stale_kernels=("gemm_pv",)),
    "stale-random-in-pv-fill-0.5": dict(stale_random=True, stale_kernels=("gemm_pv",),
                                        kernel_read_weights={"gemm_pv": 0.5}),
    "stale-random-in-pv-fill-0.75": dict(stale_random=True, stale_kernels=("gemm_pv",),
                                         kernel_read_weights={"gemm_pv": 0.75}),
    "shed-stale-pv": dict(stale_shed_kernels=("gemm_pv",)),
    **{f"shed-stale-pv-{r}": dict(stale_shed_kernels=("gemm_pv",), stale_shed_rate=r) for r in (0.25, 0.5, 0.75)},
    **{f"shed-latched-pv-{r}": dict(stale_shed_kernels=("gemm_pv",), stale_shed_rate=r, stale_shed_latched=True)
       for r in (0.25, 0.5, 0.75, 1.0)},
    **{f"shed-dead-pv-{r}": dict(stale_shed_kernels=("gemm_pv",), stale_shed_rate=r, stale_shed_latched=True,
                                 stale_shed_dead_only=True) for r in (1.0, 2.0)},
    "slru-8": dict(levels_mib=(8,)),  # a segmented LRU: 8 MiB protected beside the model's cache
    "slru-12": dict(levels_mib=(12,)),
    "levels-4x3": dict(levels_mib=(4, 4, 4)),
    "levels-2x6": dict(levels_mib=(2,) * 6),
    "levels-8x2": dict(levels_mib=(8, 8)),
    "levels-4x3-single": dict(levels_mib=(4, 4, 4), single_climbs=True),
    "levels-8x2-single": dict(levels_mib=(8, 8), single_climbs=True),
    "levels-24-4x4-single": dict(capacities=(24,), sets=57, levels_mib=(4, 4, 4, 4), single_climbs=True),
    "dueling": dict(dueling=True),
    "dueling-50": dict(capacities=(50,), sets=57, dueling=True),
    "rrip-50": dict(capacities=(50,), sets=57, rrip="static"),
    "brrip-50": dict(capacities=(50,), sets=57, rrip="bimodal"),
    # equal mixtures of five LRU caches spread about the effective capacity (the bands probe's gradual losses)
    "mix-12-45": dict(capacities=(12, 20.25, 28.5, 36.75, 45)),
    "mix-16-41": dict(capacities=(16, 22.25, 28.5, 34.75, 41)),
    "mix-20-37": dict(capacities=(20, 24.25, 28.5, 32.75, 37)),
    # the model's capacity in fewer or more hashed sets, with wider stripes; a cohort's blocks holding less
    "sets-28.5-8": dict(capacities=(28.5,), sets=8, stripe_kib=16),
    "sets-28.5-8-stripes-64": dict(capacities=(28.5,), sets=8, stripe_kib=64),
    "sets-28.5-114-stripes-16": dict(capacities=(28.5,), sets=114, stripe_kib=16),
    "cohort-0.7": dict(cohort_weight=0.7),
    "cohort-0.95": dict(cohort_weight=0.95),
    # a clean block ageing slower than a dirty one where they vie for a set's room
    "qk-lru": dict(clean_age_factor=1.0),  # the Q K GEMM's blocks in least recently used order, as before
    "clean-age-1.4": dict(clean_age_factor=1.4),
    "clean-age-1.2": dict(clean_age_factor=1.2),
    "write-clean-age-1.4": dict(clean_age_factor=1.4, clean_age_on_writes=True),
    # FA-2's cohorts each at its own pace, a step that misses taking longer (paced_run_programs), alone or with
    # random victims
    **{f"paced-{p}": dict(pace=p) for p in (0.3, 1.0, 3.0, 10.0)},
    **{f"paced-{p}-random-{r}": dict(pace=p, random_victim_share=r) for p in (1.0, 3.0) for r in (0.05, 0.2)},
    # the P V GEMM's chunks of V read as a cohort's data from heads of this many CTAs' tiles (1: every head, as before)
    **{f"pv-shared-v-{k}": dict(pv_shared_v_tiles=k) for k in (1, 2, 4, 8, 16)},
    # the softmax's victims drawn at random among a set's W least recently used blocks
    **{f"softmax-random-{w}": dict(kernel_victim_windows={"softmax": w}) for w in (8, 64)},
    # the P V GEMM's CTAs each this many rows of O (the model: 256), so a grid of as many rows runs in more waves
    **{f"pv-tile-rows-{r}": dict(pv_tile_rows=r) for r in (128, 160, 192)},
    # the softmax writing each block's P as it reads its S (no lead), its read fills at the machine file's weight or these
    "softmax-at-once": dict(softmax_at_once=True),
    **{f"softmax-at-once-{w}": dict(softmax_at_once=True, kernel_read_weights={"softmax": w}) for w in (0.25, 0.35)},
    # the softmax's writes (P) holding that share of their size
    **{f"softmax-writes-{w}": dict(kernel_write_weights={"softmax": w}) for w in (0.75, 0.9)},
    # the FA-2 kernels' writes (O) holding that share of their size (1.1: the model)
    **{f"flash-writes-{w}": dict(kernel_write_weights={"flash2_forward": w}) for w in (1.0, 1.1, 1.25)},
    # an eager write-back: dirty blocks within the least recently used W MiB (over all sets) written back, kept clean
    **{f"clean-tail-{w}": dict(clean_tail=w) for w in (1, 2)},
}


def l2_of(variant: dict):
    """A factory for simflash.model.physical.l2_cache: the machine file's L2 with the variant's changes."""

    def make(gpu):
        cal = gpu.calibration
        options = {"read_fill_weight": cal["l2_read_fill_weight"], "flush_residue_bytes": int(cal["l2_flush_residue_bytes"]),
                   "residue_ramp_bytes": cal["l2_residue_ramp_bytes"], "cohort_weight": cal["l2_cohort_weight"],
                   **{k: v for k, v in variant.items()
                      if k not in ("capacities", "pv_tiles", "pace", "pv_shared_v_tiles", "sets", "stripe_kib",
                                   "levels_mib", "single_climbs", "dueling", "rrip", "softmax_at_once",
                                   "pv_tile_rows")}}
        options["dirty_limit"] = options.get("dirty_limit", float("inf")) * MiB
        options.setdefault("dirty_read_window_bytes", cal.get("l2_dirty_read_window_bytes"))
        options["kernel_read_weights"] = {**kernel_figures(gpu, "read_weight"), **variant.get("kernel_read_weights", {})}
        options["kernel_write_weights"] = {**kernel_figures(gpu, "write_weight"), **variant.get("kernel_write_weights", {})}
        ageing = kernel_figures(gpu, "clean_age_factor")  # the machine file's, in the variant's own terms
        if "clean_age_factor" not in variant and ageing:
            (options["clean_age_factor"],) = set(ageing.values())
            options["clean_age_kernels"] = tuple(ageing)
        if "capacities" in variant and "sets" not in variant:
            return L2Mixture(tuple(L2Variant(c * MiB, **options) for c in variant["capacities"]))
        (capacity,) = variant.get("capacities", (cal["l2_effective_bytes"] / MiB,))
        sets = variant.get("sets", int(cal["l2_sets"]))
        stripe_bytes = variant["stripe_kib"] * 1024 if "stripe_kib" in variant else int(cal["l2_stripe_bytes"])
        options["flush_residue_bytes"] //= sets
        options["residue_ramp_bytes"] /= sets
        options["dirty_limit"] /= sets  # each set caps its share of the dirty bytes
        if options["dirty_read_window_bytes"] is not None:
            options["dirty_read_window_bytes"] /= sets  # each set sees its share of the reads
        options["clean_tail"] = options.get("clean_tail", 0.0) * MiB / sets
        def sets_of(cache, each=lambda i: {}):  # the model's sets, each a `cache` with its share
            share = (capacity * MiB / sets, options["read_fill_weight"], options["flush_residue_bytes"],
                     options["residue_ramp_bytes"], options["cohort_weight"], options["kernel_read_weights"])
            return L2Sets(tuple(cache(*share, **each(i)) for i in range(sets)), stripe_bytes)

        if "rrip" in variant:  # replacing by re-reference prediction
            return sets_of(L2RRIP, lambda i: {"bimodal": variant["rrip"] == "bimodal"})
        if variant.get("dueling"):  # 4 sets leading with LRU, 4 with bimodal fills, the others following
            duel = [512, 0]
            return sets_of(L2Dueling, lambda i: {"role": {0: "lru", 1: "bip"}.get(i % 16, "follow"), "duel": duel})
        if "levels_mib" in variant:  # each with its share of every level
            grid.lockstep = _ticking_lockstep  # run_programs looks it up at each call: the clock ticks
            return sets_of(L2Levels, lambda i: {"level_bytes": tuple(m * MiB / sets for m in variant["levels_mib"]),
                                                "single_climbs": variant.get("single_climbs", False)})
        return L2Sets(tuple(L2Variant(capacity * MiB / sets, **options) for _ in range(sets)), stripe_bytes)

    return make


def probe_rows(variant: dict, show_rows: bool = False) -> tuple[int, int, float]:
    """The probe's kernel rows (reads and writes) within 10% / 1 MiB, their number, and the absolute error;
    each row printed with `show_rows`."""
    make = l2_of(variant)
    ok = total = 0
    error = 0.0
    for row in json.loads((HERE / "probe.json").read_text())["rows"]:
        l2 = make(gpu_spec("H200"))
        l2.flush()
        steps = [("write", "W", row["x_mib"])]
        steps += {"stream": [("read", "R", row["y_mib"])], "reread": [("read", "W", row["x_mib"])],
                  "stream_reread": [("read", "R", row["y_mib"]), ("read", "W", row["x_mib"])],
                  "write_write": [("write", "R", row["y_mib"])]}[row["pattern"]]
        for step, (op, buffer, mib) in enumerate(steps):
            l2.kernel = f"k{step}"
            for block in range(mib * MiB // PROBE_BLOCK):
                getattr(l2, op)((buffer, block), PROBE_BLOCK)
            l2.end_kernel()
        flows = l2.traffic().by_kernel
        if show_rows:
            print(f"    {row['pattern']:14s} X={row['x_mib']:3d} Y={row['y_mib']:3d}  " + "  ".join(
                f"{k['name']}: R {flows[f'k{step}'].dram_read_bytes / MiB:5.1f} / {k['dram_read_bytes'] / MiB:5.1f}"
                f" W {flows[f'k{step}'].dram_write_bytes / MiB:5.1f} / {k['dram_write_bytes'] / MiB:5.1f}"
                for step, k in enumerate(row["kernels"])))
        for step, measured in enumerate(row["kernels"]):
            for key in ("dram_read_bytes", "dram_write_bytes"):
                predicted = getattr(flows[f"k{step}"], key)
                total += 1
                ok += abs(predicted - measured[key]) <= max(0.1 * measured[key], MiB)
                error += abs(predicted - measured[key]) / MiB
    return ok, total, error


def sweep_rows(sweep: str, subset: str | None = None, sdpa: bool = False, modes: tuple[str, ...] = ("cold", "warm")
               ) -> dict[tuple[str, str, str], list[int]]:
    """{(implementation, cache, reads | writes): [rows within 10% / 1 MiB, rows]} of a sweep's naive and FA-2
    rows (and SDPA's, with `sdpa`)."""
    implementations = ("naive", "fa2", "sdpa_flash") if sdpa else ("naive", "fa2")
    return tally((c for mode in modes
                  for c in compare(load(SWEEP_FOLDER / f"{sweep}_{mode}.json"), implementations=implementations, sweep=sweep)
                  if subset is None or c.subset == subset), lambda c: c.implementation)


def unseen_rows(sweep: str, mode: str, implementations: tuple[str, ...]
                ) -> tuple[dict[tuple[str, str, str], list[int]], list[str]]:
    """{(kernel, or implementation where not naive; cache; reads | writes): [rows within 10% / 1 MiB, rows]} of
    a sweep's rows of `implementations` outside the calibration fit set, and a line per row: its DRAM MiB read
    and written, measured / predicted, `*` where not within."""
    rows = [c for c in compare(load(SWEEP_FOLDER / f"{sweep}_{mode}.json"), implementations=implementations,
                               sweep=sweep) if c.subset != "fit"]
    lines = [f"    {sweep} {c.cache} {c.implementation} {c.kernel} heads {c.config['heads']} N {c.config['n']} "
             f"d {c.config['d']}{' causal' if c.config['causal'] else ''}: " + "  ".join(
                 f"{what} {c.measured[key] / MiB:.1f} / {c.predicted[key] / MiB:.1f}{'' if c.ok(key) else ' *'}"
                 for what, key in (("R", "dram_read_bytes"), ("W", "dram_write_bytes"))) for c in rows]
    return tally(rows, lambda c: c.kernel if c.implementation == "naive" else c.implementation), lines


def tally(comparisons, label) -> dict[tuple[str, str, str], list[int]]:
    """{(label(row), cache, reads | writes): [rows within 10% / 1 MiB, rows]}."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    for c in comparisons:
        for key, name in (("dram_read_bytes", "reads"), ("dram_write_bytes", "writes")):
            cell = counts.setdefault((label(c), c.cache, name), [0, 0])
            cell[0] += c.ok(key)
            cell[1] += 1
    return counts


def show(counts: dict[tuple[str, str, str], list[int]]) -> str:
    within = sum(ok for ok, _ in counts.values())
    rows = sum(n for _, n in counts.values())
    cells = "  ".join(f"{i} {m} {k} {ok}/{n}" for (i, m, k), (ok, n) in sorted(counts.items()))
    return f"{within} of {rows}  ({cells})"


def main(names: list[str], sweeps: bool, sdpa: bool, show_rows: bool, heads: bool = False, naive: bool = False,
         flash: bool = False, retention: bool = False, band_probe: bool = False, fa2_only: bool = False,
         hint_probe: bool = False) -> None:
    model_naive = physical._naive
    for name in names or list(VARIANTS):
        variant = VARIANTS[name] if name in VARIANTS else kernel_weights(name)
        physical.l2_cache = l2_of(variant)  # what predict() builds its L2 with
        physical._naive = pv_tiles.naive if variant.get("pv_tiles") else model_naive
        physical.run_programs = paced_run_programs(variant["pace"]) if "pace" in variant else _model_run_programs
        naive_algorithm.PV_SHARED_V_TILES = variant.get("pv_shared_v_tiles", MODEL_PV_SHARED_V_TILES)
        physical.softmax_resident_rows = (lambda gpu, n_kv, itemsize: 0) if variant.get("softmax_at_once") else \
            MODEL_SOFTMAX_RESIDENT_ROWS
        naive_algorithm.GEMM_TILE_ROWS = chip.GEMM_TILE_ROWS = variant.get("pv_tile_rows", MODEL_GEMM_TILE_ROWS)
        if naive or flash:
            implementations = ("naive",) if naive else ("fa2",) if fa2_only else ("fa2", "sdpa_flash")
            with Pool(2) as pool:
                parts = pool.starmap(unseen_rows, [(s, m, implementations) for s in REGIME_SWEEPS
                                                   for m in ("cold", "warm")])
            table = summed([t for t, _ in parts])
            by_cache = summed([{(m, k): cell} for (_, m, k), cell in table.items()])
            print(f"{name}: {' and '.join(implementations)} rows of the eight sweeps less the fit set: "
                  + "  ".join(f"{m} {k} {ok}/{n}" for (m, k), (ok, n) in sorted(by_cache.items())), flush=True)
            print(f"  by {'kernel' if naive else 'implementation'}: {show(table)}", flush=True)
            if show_rows:
                print("\n".join(line for _, lines in parts for line in lines), flush=True)
            continue
        ok, total, error = probe_rows(variant, show_rows)
        print(f"{name}: probe {ok} of {total} within, {error:.0f} MiB off in all", flush=True)
        if heads:
            print(f"  heads probe (MiB a head beyond Q + K + V, predicted / measured): {heads_rows()}", flush=True)
        if retention:
            print(f"  retention probe (re-reads missed, predicted / measured): {retention_rows(variant)}", flush=True)
        if band_probe:
            print(f"  bands probe (DRAM MiB read beyond the compulsory, predicted / measured): {bands_rows(variant)}",
                  flush=True)
            continue
        if hint_probe:
            print(f"  hints probe (MiB of the dirty W written back, predicted / measured): {hints_rows(variant)}",
                  flush=True)
            continue
        parts = [("calibration fit", "calibration", "fit")]
        if sweeps:
            parts += [("calibration held-out", "calibration", "held-out")] + [(s, s, None) for s in REGIME_SWEEPS[1:]]
        with Pool(2) as pool:  # each sweep's cold and warm rows side by side (the workers inherit the variant)
            halves = pool.starmap(sweep_rows, [(sweep, subset, sdpa, (mode,)) for _, sweep, subset in parts
                                               for mode in ("cold", "warm")])
        tables = [summed(halves[2 * i:2 * i + 2]) for i in range(len(parts))]
        for (label, _, _), table in zip(parts, tables):
            print(f"  {label}: {show(table)}", flush=True)
        if not sweeps:
            continue
        all_sweeps = summed(tables)
        by_implementation = summed([{implementation: cell} for (implementation, _, _), cell in all_sweeps.items()])
        print(f"  all eight sweeps: {show(all_sweeps)}", flush=True)
        print("  all eight sweeps by implementation: "
              + "  ".join(f"{i} {ok} of {n}" for i, (ok, n) in sorted(by_implementation.items())), flush=True)


def kernel_weights(name: str) -> dict:
    """A variant named `fills:KERNEL=WEIGHT,...`: the read-fill weight in the kernels it names (`all`: in every
    other kernel, in place of the machine file's); `writes:KERNEL=WEIGHT,...`: the share of its size a block
    written in those kernels holds."""
    prefix, _, items = name.partition(":")
    if prefix not in ("fills", "writes") or not items:
        raise SystemExit(f"unknown variant {name!r}: one of {sorted(VARIANTS)}, fills:KERNEL=WEIGHT,... or "
                         "writes:KERNEL=WEIGHT,...")
    weights = {kernel: float(weight) for kernel, weight in (item.split("=") for item in items.split(","))}
    if prefix == "writes":
        return {"kernel_write_weights": weights}
    everywhere = {"read_fill_weight": weights.pop("all")} if "all" in weights else {}
    return {"kernel_read_weights": weights, **everywhere}


def heads_rows() -> str:
    """The heads probe's configurations, cold: DRAM MiB read beyond Q + K + V per head, predicted / measured."""
    cells = []
    for entry in json.loads((SWEEP_FOLDER / "sdpa_kv_order" / "heads.json").read_text())["configs"]:
        c = entry["config"]
        compulsory = 3 * c["n"] * c["d"] * 2 * c["heads"]
        predicted = physical.predict("fa2", c["n"], c["d"], heads=c["heads"], causal=True, cache="cold",
                                     kernel=KERNEL_OF[c["algorithm"]]).kernels[0].dram_read_bytes
        measured = sum(k["dram_read_bytes"] for k in entry["kernels"])
        cells.append(f"{c['algorithm']} {c['n']}x{c['heads']} {(predicted - compulsory) / MiB / c['heads']:.1f} / "
                     f"{(measured - compulsory) / MiB / c['heads']:.1f}")
    return "; ".join(cells)


RETENTION_PIECE = 64 * 1024  # what a rotated reader reads per lock-step step in the retention replay


def retention_rows(variant: dict) -> str:
    """The retention probe's rotated readers (retention.json) replayed through the variant's L2 in lock-step:
    528 readers, each reading one 64 KiB piece of its head's share per step, starting at its own place;
    per case, the share of re-reads that miss, predicted / measured."""
    make = l2_of(variant)
    report = json.loads((HERE / "retention.json").read_text())
    ctas, cells = report["ctas"], []
    for row in report["rows"]:
        if row["pattern"] != "rotated":
            continue
        heads, parts, size = row["heads"], row["parts"], row["x_mib"] * MiB
        l2 = make(gpu_spec("H200"))
        l2.flush()
        l2.kernel = "rotated"
        pieces, readers = size // RETENTION_PIECE // heads, ctas // heads  # a head's pieces and readers
        starts = [b % readers * pieces // readers for b in range(ctas)]
        for step in range(pieces // parts):
            CLOCK[0] += 1
            for b in range(ctas):
                l2.read(("X", b // readers, (starts[b] + step) % pieces), RETENTION_PIECE)
        l2.end_kernel()
        missed = l2.traffic().by_kernel["rotated"].dram_read_bytes - size
        rereads = size * (readers / parts - 1)
        cells.append(f"{heads}h 1/{parts} {row['x_mib']} MiB {missed / rereads:.1%} / "
                     f"{(row['dram_read_bytes'] - size) / rereads:.1%}")
    return "; ".join(cells)


def hints_rows(variant: dict) -> str:
    """The hints probe's plain `read` cases (hints.json: W of 24 MiB written, then W read beside a fresh R) and
    probe.py's R read alone after the same W, replayed through the variant's L2: MiB of W written back, predicted /
    measured."""
    make = l2_of(variant)
    alone = hints.stream_alone_write_bytes()
    cells = []
    for row in json.loads((HERE / "hints.json").read_text())["rows"]:
        if row["pattern"] != "read" or row["hint"]:
            continue
        x, y = row["x_mib"], row["y_mib"]
        cells.append(f"W beside R {y}: {hints.predicted_write_bytes(x, y, make) / MiB:.2f} / "
                     f"{row['kernels'][1]['dram_write_bytes'] / MiB:.2f}; R {y} alone: "
                     f"{hints.predicted_write_bytes(x, y, make, beside=False) / MiB:.2f} / {alone[x, y] / MiB:.2f}")
    return "; ".join(cells)


def bands_rows(variant: dict) -> str:
    """The bands probe (bands.json) replayed through the variant's L2: its 132 CTAs in lock-step, one tile each
    a step (the tiles in launch order), each step's reads of K's blocks and Q's bands first (a block several of
    the step's tiles read, a cohort's), then its S tiles written (or, `read`, another buffer's read); per
    case, the DRAM MiB read beyond the compulsory, predicted / measured."""
    make = l2_of(variant)
    cells = []
    for row in json.loads((HERE / "bands.json").read_text())["rows"]:
        n, group = row["n"], row["group"]
        per_band, band_count = n // bands.KEY_BLOCK, n // bands.QUERY_BAND
        group = group or per_band
        l2 = make(gpu_spec("H200"))
        l2.flush()
        l2.kernel = "bands"
        tiles = per_band * band_count
        for first in range(0, tiles, bands.CTAS):
            step = range(first, min(first + bands.CTAS, tiles))
            places = [(t // (group * band_count) * group + t % (group * band_count) % group,
                       band_count - 1 - t % (group * band_count) // group
                       if row.get("serpentine") and t // (group * band_count) % 2 else
                       t % (group * band_count) // group) for t in step]  # (block of K, band of Q)
            for key, size in ((("K", b), 32 * 1024) for b in sorted({b for b, _ in places})):
                l2.read(key, size, sum(b == key[1] for b, _ in places))
            for key, size in ((("Q", q), 64 * 1024) for q in sorted({q for _, q in places})):
                l2.read(key, size, sum(q == key[1] for _, q in places))
            for t in step:
                if row["mode"] == "write":
                    l2.write(("S", t), 64 * 1024)
                elif row["mode"] == "read":
                    l2.read(("R", t), 64 * 1024)
        l2.end_kernel()
        compulsory = 2 * bands.operand_bytes(n) + (bands.stream_bytes(n) if row["mode"] == "read" else 0)
        predicted = l2.traffic().by_kernel["bands"].dram_read_bytes - compulsory
        cells.append(f"{row['mode']} {n} G{row['group'] or '-'}{'s' if row.get('serpentine') else ''} {predicted / MiB:.2f} / "
                     f"{(row['dram_read_bytes'] - compulsory) / MiB:.2f}")
    return "; ".join(cells)


def summed(tables: list[dict]) -> dict:
    """Several tables of {cell: [rows within, rows]} added up cell by cell."""
    total: dict = {}
    for table in tables:
        for key, (ok, n) in table.items():
            cell = total.setdefault(key, [0, 0])
            cell[0] += ok
            cell[1] += n
    return total


if __name__ == "__main__":
    flags = {"--sweeps", "--sdpa", "--probe-rows", "--heads", "--naive", "--flash", "--retention", "--bands", "--fa2",
             "--hints"}
    main([a for a in sys.argv[1:] if a not in flags], "--sweeps" in sys.argv[1:], "--sdpa" in sys.argv[1:],
         "--probe-rows" in sys.argv[1:], "--heads" in sys.argv[1:], "--naive" in sys.argv[1:],
         "--flash" in sys.argv[1:] or "--fa2" in sys.argv[1:], "--retention" in sys.argv[1:],
         "--bands" in sys.argv[1:], "--fa2" in sys.argv[1:], "--hints" in sys.argv[1:])
