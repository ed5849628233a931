"""Configuration as data: storage dtypes, GPU specs (read from the machine files), causal variants."""

from __future__ import annotations

import importlib.resources
import math
import os
import pathlib
import sys
from typing import Any, Literal, TypeVar

import attrs
import ml_dtypes
import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

KiB = 1024
MiB = 1024**2
GiB = 1024**3

# HBM storage dtypes by name. On-chip math and the online-softmax state are always float32.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
}
STATE_DTYPE = np.dtype(np.float32)

# The public API's choices, as types (the checks below hold values to them at run time).
StorageDtypeName = Literal["float16", "bfloat16", "float32"]
CausalVariant = Literal["upper_left", "lower_right"]
STORAGE_DTYPE_NAMES: tuple[StorageDtypeName, ...] = ("float16", "bfloat16", "float32")

# PyTorch's names. upper_left: query r sees keys c <= r (SDPA is_causal).
# lower_right: query r sees keys c <= r + n_kv - n_q (FlashAttention >= 2.1).
CAUSAL_VARIANTS: tuple[CausalVariant, ...] = ("upper_left", "lower_right")

Choice = TypeVar("Choice", bound=str)


def check_choice(name: str, value: object, choices: tuple[Choice, ...]) -> Choice:
    """value as one of choices, the values of a Literal type (a command-line string becomes that type here), or a
    ValueError naming the argument and the choices."""
    for choice in choices:
        if isinstance(value, str) and value == choice:
            return choice
    raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype for a storage-dtype name, or a ValueError naming the choices."""
    try:
        return STORAGE_DTYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be one of {sorted(STORAGE_DTYPES)}, got {name!r}") from None


def check_causal_variant(name: object) -> CausalVariant:
    return check_choice("causal_variant", name, CAUSAL_VARIANTS)


def check_window(window: object) -> tuple[int, int]:
    """A sliding window (left, right): two integers >= -1, -1 meaning unbounded on that side."""
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < -1 for w in window)):
        raise ValueError(f"window must be (left, right), two integers >= -1 (-1: unbounded on that side), got {window!r}")
    return int(window[0]), int(window[1])


def check_bool(name: str, value: object) -> bool:
    """A boolean option: True or False (NumPy's bool too), never a string or a number that reads as one."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@attrs.frozen
class GPUSpec:
    """One GPU's figures, read from its machine file in simflash/machines/, which cites a source for
    every number. Peak rates are dense datasheet figures: leads, not measurements."""

    name: str
    # -- chip
    sm_count: int
    clock_hz: float  # the boost clock that fp32_flops_per_s and sfu_ops_per_s assume
    # -- L2 cache
    l2_bytes: int
    l2_sector_bytes: int
    l2_line_bytes: int
    l2_partitions: int
    # -- per SM: the limits the occupancy calculator applies
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_ctas_per_sm: int
    max_threads_per_cta: int
    registers_per_sm: int  # 32-bit registers
    max_registers_per_thread: int
    register_alloc_unit_per_warp: int
    sub_partitions_per_sm: int  # each holds an equal share of the register file
    shared_bytes_per_sm: int  # the largest shared-memory carve-out
    max_shared_bytes_per_cta: int  # the opt-in limit
    shared_reserved_bytes_per_cta: int  # taken by the system from every CTA's share
    shared_alloc_unit_bytes: int
    # -- throughput
    peak_flops: dict[str, float]  # FLOP/s by storage dtype (tensor cores for 16-bit, plain fp32 otherwise)
    fp32_flops_per_s: float  # the non-tensor FMA pipes
    sfu_ops_per_s: float  # exp2, rcp, rsqrt, log2 results
    hbm_bytes_per_s: float
    l2_bytes_per_s: float  # an estimate: vendors publish no L2 bandwidth figure
    # Model parameters fitted to measurements; the machine file names the measurement behind each.
    calibration: dict[str, float] = attrs.field(factory=dict)

    @property
    def smem_carveout_bytes(self) -> int:
        """The shared-memory carve-out per SM: shared_bytes_per_sm by its older name."""
        return self.shared_bytes_per_sm

    def ridge_point(self, dtype: str = "float16") -> float:
        """FLOP per HBM byte at which the roofline turns from bandwidth- to compute-bound."""
        return self.peak_flops[dtype] / self.hbm_bytes_per_s


attrs.resolve_types(GPUSpec)


def load_machine(path: str | os.PathLike) -> GPUSpec:
    """A GPUSpec from a machine file: TOML whose keys are GPUSpec's fields (see simflash/machines/)."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read machine file {path}: {error.strerror}") from None
    return _parse_machine(text, str(path))


def _parse_machine(text: str, source: str) -> GPUSpec:
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"machine file {source}: not valid TOML: {error}") from None
    fields = attrs.fields_dict(GPUSpec)
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ValueError(f"machine file {source}: unknown key {unknown[0]!r}; the keys are GPUSpec's fields")
    values: dict[str, Any] = {}  # each checked against its field's type by _machine_value
    for key, field in fields.items():
        if key in table:
            values[key] = _machine_value(source, key, table[key], field.type)
        elif field.default is attrs.NOTHING:
            raise ValueError(f"machine file {source}: missing key {key!r}")
    missing_dtypes = sorted(set(STORAGE_DTYPES) - set(values["peak_flops"]))
    if missing_dtypes:
        raise ValueError(f"machine file {source}: missing key 'peak_flops.{missing_dtypes[0]}'")
    return GPUSpec(**values)


def _machine_value(source: str, key: str, value: object, kind: object, zero_allowed: bool = False) -> object:
    """value checked against a GPUSpec field's type: str, a positive int or float, or a table of floats (in
    `calibration`, fitted figures, zero allowed: a weight may be nothing)."""
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"machine file {source}: key {key!r} must be a string, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"machine file {source}: key {key!r} must be a positive integer, got {value!r}")
        return value
    if kind is float:
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value < 0 or (value == 0 and not zero_allowed)):
            expected = "a number >= 0" if zero_allowed else "a positive number"
            raise ValueError(f"machine file {source}: key {key!r} must be {expected}, got {value!r}")
        return float(value)
    if not isinstance(value, dict):  # dict[str, float]
        raise ValueError(f"machine file {source}: key {key!r} must be a table of numbers, got {value!r}")
    return {name: _machine_value(source, f"{key}.{name}", number, float, zero_allowed=key == "calibration")
            for name, number in value.items()}


# The built-in machine files, in the order tables list them.
BUILTIN_MACHINES = ("A100", "H100", "H200", "B200")


def _builtin_machine(name: str) -> GPUSpec:
    resource = importlib.resources.files("simflash") / "machines" / f"{name}.toml"
    return _parse_machine(resource.read_text(encoding="utf-8"), f"simflash/machines/{name}.toml")


GPUS: dict[str, GPUSpec] = {name: _builtin_machine(name) for name in BUILTIN_MACHINES}
DEFAULT_GPU = "H200"


def gpu_spec(gpu: str | GPUSpec) -> GPUSpec:
    """A machine by name, or the machine given (a GPUSpec, e.g. one evolved with other figures)."""
    if isinstance(gpu, GPUSpec):
        return gpu
    try:
        return GPUS[gpu]
    except KeyError:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}") from None
