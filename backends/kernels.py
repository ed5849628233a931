"""The CUDA kernels: sources read as package data, compiled through CuPy's RawModule, one template
instantiation per configuration (name_expressions), and the configurations they are built for.

CuPy is imported here, lazily, and nowhere at module level: `import simflash` never needs a GPU.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from typing import TYPE_CHECKING, TypeAlias

import attrs

if TYPE_CHECKING:  # CuPy is imported lazily, at run time (import_cupy)
    import cupy

    DeviceArray: TypeAlias = cupy.ndarray

# Template argument DT of the kernels (StorageType in ptx.cuh): 16-bit storage on the tensor cores.
STORAGE_TYPES = {"float16": 0, "bfloat16": 1}
# The instantiations the FA-2 kernel is built for.
HEAD_DIMS = (64, 128, 256)
BLOCK_Q = (64, 128)  # B_r: a multiple of 16, one warp per 16 rows
BLOCK_KV = (32, 64, 128)  # B_c: a multiple of 16
# The instantiations the FA-2 backward kernels are built for: B_c / 16 warps, one per 16 rows of the KV
# tile, and B_r a divisor of B_c (d = 128 with B_r = 128 needs 256 KiB of shared memory: refused).
BACKWARD_HEAD_DIMS = (64, 128)
BACKWARD_BLOCK_Q = (64, 128)
BACKWARD_BLOCK_KV = (128,)
BACKWARD_MIN_COMPUTE_CAPABILITY = 90  # stmatrix and vector float32 atomics
ELEMENTWISE_THREADS = 256  # the backward's preprocess and convert kernels
# Flash-Decoding (flash_decoding_split.cu): FA-2's split-KV query tiles of 64 rows, KV tiles 3 stages
# deep. KV tiles by head dim, the default first: half of FA-2's (flash_api.cpp's set_params_splitkv), so
# that Q_i and the stages fit twice in an SM, as FA-2's split heuristic assumes (it counts 2 CTAs an SM);
# FA-2's own, 256 rows at d = 64 and 128 at d = 128, fit once.
DECODE_BLOCK_Q = 64
DECODE_BLOCK_KV = {64: (128, 256), 128: (64, 128)}
DECODE_SLICES = (1, 2, 4)  # warps sharing a 16-row group of the query tile
DECODE_THREADS = 128
DECODE_STAGES = 3
COMPILE_OPTIONS = ("--std=c++17",)
SOFTMAX_THREADS = 256  # naive_softmax.cu's block size
CUPY_HINT = "install CuPy for your CUDA version: pip install 'simflash[cuda13]' (or 'simflash[cuda12]')"


def import_cupy():
    """CuPy, or a RuntimeError saying how to get it."""
    try:
        import cupy
    except ImportError as error:
        raise RuntimeError(f"the GPU backend needs CuPy; {CUPY_HINT}") from error
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees a CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    return bool(cupy.is_available())


def kernel_source(filename: str, _seen: set[str] | None = None) -> str:
    """The text of a kernel source shipped with the package, its local #include "x.cuh" lines inlined,
    each header once, as its #pragma once asks (NVRTC compiles from a string and sees no files)."""
    seen = set() if _seen is None else _seen
    seen.add(filename)
    text = importlib.resources.files("simflash.backends").joinpath(filename).read_text(encoding="utf-8")
    return re.sub(r'^#include "([^"]+)"$', lambda m: "" if m.group(1) in seen else kernel_source(m.group(1), seen),
                  text, flags=re.MULTILINE)


@functools.cache
def compiled(filename: str, name_expression: str):
    """The cupy.RawKernel of one template instantiation (compiled once per process; CuPy also caches
    the binary on disk)."""
    cupy = import_cupy()
    module = cupy.RawModule(code=kernel_source(filename), options=COMPILE_OPTIONS, name_expressions=[name_expression])
    return module.get_function(name_expression)


def _choice(name: str, value, choices) -> None:
    if isinstance(value, bool) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)} for the GPU kernel, got {value!r}")


def device_shared_bytes() -> int:
    """The most shared memory one CTA may use on the current device (the opt-in limit)."""
    cupy = import_cupy()
    runtime = cupy.cuda.runtime
    return int(runtime.deviceGetAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, cupy.cuda.Device().id))


def _fit_shared(kernel, dynamic_bytes: int, what: str):
    """Raise the kernel's dynamic shared-memory limit to `dynamic_bytes`, or refuse what cannot fit."""
    limit = device_shared_bytes()
    total = dynamic_bytes + kernel.shared_size_bytes
    if total > limit:
        raise ValueError(f"{what} needs {total} bytes of shared memory per CTA; this GPU allows {limit}: "
                         f"choose smaller tiles (supported: {supported()})")
    kernel.max_dynamic_shared_size_bytes = dynamic_bytes
    return kernel


@attrs.frozen
class Flash2Kernel:
    """One instantiation of flash2_forward.cu: storage dtype, B_r, B_c, head dim, and the build."""

    dtype: str = "float16"
    block_q: int = 128
    block_kv: int = 64
    d: int = 128
    instrumented: bool = False

    def __attrs_post_init__(self) -> None:
        _choice("dtype", self.dtype, STORAGE_TYPES)
        _choice("block_q", self.block_q, BLOCK_Q)
        _choice("block_kv", self.block_kv, BLOCK_KV)
        _choice("d", self.d, HEAD_DIMS)

    @property
    def name_expression(self) -> str:
        build = "true" if self.instrumented else "false"
        return f"flash2_forward<{STORAGE_TYPES[self.dtype]}, {self.block_q}, {self.block_kv}, {self.d}, {build}>"

    @property
    def threads(self) -> int:
        return self.block_q // 16 * 32

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: Q_i, and K_j and V_j double-buffered, 2 bytes a value."""
        return (self.block_q + 4 * self.block_kv) * self.d * 2

    def function(self):
        """The compiled kernel, its shared-memory limit raised; refused where the GPU cannot hold it."""
        what = f"flash2_forward with block_q={self.block_q}, block_kv={self.block_kv}, d={self.d}"
        return _fit_shared(compiled("flash2_forward.cu", self.name_expression), self.shared_bytes, what)

    def resources(self) -> dict:
        return resources(self.function(), self.name_expression, self.threads, self.shared_bytes)


def resources(kernel, name_expression: str, threads: int, dynamic_bytes: int) -> dict:
    """What the compiler gave a kernel: registers, spills to local memory, shared memory."""
    return {
        "kernel": name_expression,
        "threads": threads,
        "registers": int(kernel.num_regs),
        "local_bytes": int(kernel.local_size_bytes),
        "shared_bytes": dynamic_bytes + int(kernel.shared_size_bytes),
    }


def decode_slices(rows: int) -> int:
    """Warps of a split CTA sharing each 16-row group of a query tile holding `rows` (packed) rows: all 4
    on one group up to 16 rows, 2 on each of two up to 32, one warp a group beyond."""
    return 4 if rows <= 16 else 2 if rows <= 32 else 1


@functools.cache
def _decode_split_function(name_expression: str, dynamic_bytes: int, what: str):
    """The split kernel, set up once (no attribute call in a timed launch): its shared-memory limit, and
    the largest carve-out, so that two CTAs' stages share an SM as the split heuristic counts without
    resting on the driver's choice (which, on the H200, gave two as well: decode_diagnose.json)."""
    kernel = _fit_shared(compiled("flash_decoding_split.cu", name_expression), dynamic_bytes, what)
    kernel.preferred_shared_memory_carveout = 100
    return kernel


@attrs.frozen
class DecodeSplitKernel:
    """One instantiation of flash_decoding_split.cu: storage dtype, head dim, slices, and the build."""

    dtype: str = "float16"
    d: int = 128
    block_kv: int = 64
    slices: int = 4
    instrumented: bool = False

    def __attrs_post_init__(self) -> None:
        _choice("dtype", self.dtype, STORAGE_TYPES)
        _choice("d", self.d, DECODE_BLOCK_KV)
        _choice("block_kv", self.block_kv, DECODE_BLOCK_KV[self.d])
        _choice("slices", self.slices, DECODE_SLICES)

    @property
    def name_expression(self) -> str:
        build = "true" if self.instrumented else "false"
        return (f"flash_decoding_split<{STORAGE_TYPES[self.dtype]}, {self.block_kv}, {self.d}, {self.slices}, "
                f"{build}>")

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: Q_i and DECODE_STAGES buffers of K_j and V_j, 2 bytes a value."""
        return (DECODE_BLOCK_Q + DECODE_STAGES * 2 * self.block_kv) * self.d * 2

    def function(self):
        what = f"flash_decoding_split with d={self.d}, block_kv={self.block_kv}"
        return _decode_split_function(self.name_expression, self.shared_bytes, what)

    def resources(self) -> dict:
        return resources(self.function(), self.name_expression, DECODE_THREADS, self.shared_bytes)


@attrs.frozen
class DecodeCombineKernel:
    """One instantiation of flash_decoding_combine.cu: storage dtype, head dim, and the build."""

    dtype: str = "float16"
    d: int = 128
    instrumented: bool = False

    def __attrs_post_init__(self) -> None:
        _choice("dtype", self.dtype, STORAGE_TYPES)
        _choice("d", self.d, DECODE_BLOCK_KV)

    @property
    def name_expression(self) -> str:
        return f"flash_decoding_combine<{STORAGE_TYPES[self.dtype]}, {self.d}, {'true' if self.instrumented else 'false'}>"

    @staticmethod
    def shared_bytes(num_splits: int) -> int:
        """Dynamic shared memory: the row's weights, one float a split."""
        return num_splits * 4

    def function(self, num_splits: int):
        what = f"flash_decoding_combine with {num_splits} splits"
        return _fit_shared(compiled("flash_decoding_combine.cu", self.name_expression),
                           self.shared_bytes(num_splits), what)

    def resources(self, num_splits: int) -> dict:
        return resources(self.function(num_splits), self.name_expression, DECODE_THREADS, self.shared_bytes(num_splits))


@attrs.frozen
class Flash2BackwardKernels:
    """The three FA-2 backward kernels of one configuration: storage dtype, B_r, B_c, head dim, build.

    flash2_backward_preprocess.cu (D and dQ_accum), flash2_backward.cu (dK, dV, dQ_accum),
    flash2_backward_convert.cu (dQ), in launch order.
    """

    dtype: str = "float16"
    block_q: int = 64
    block_kv: int = 128
    d: int = 128
    instrumented: bool = False

    def __attrs_post_init__(self) -> None:
        _choice("dtype", self.dtype, STORAGE_TYPES)
        _choice("block_q", self.block_q, BACKWARD_BLOCK_Q)
        _choice("block_kv", self.block_kv, BACKWARD_BLOCK_KV)
        _choice("d", self.d, BACKWARD_HEAD_DIMS)

    @property
    def name_expressions(self) -> tuple[str, str, str]:
        dt, build = STORAGE_TYPES[self.dtype], "true" if self.instrumented else "false"
        return (f"flash2_backward_preprocess<{dt}, {self.block_q}, {self.d}, {build}>",
                f"flash2_backward<{dt}, {self.block_q}, {self.block_kv}, {self.d}, {build}>",
                f"flash2_backward_convert<{dt}, {build}>")

    @property
    def threads(self) -> int:
        """Threads of the main kernel: one warp per 16 rows of the KV tile."""
        return self.block_kv // 16 * 32

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of the main kernel: K_j, V_j; Q_i, dO_i double-buffered; P_ij, dS_ij."""
        return (2 * self.block_kv * self.d + 4 * self.block_q * self.d + 2 * self.block_q * self.block_kv) * 2

    def functions(self):
        """The compiled (preprocess, main, convert) kernels; refused where the GPU cannot run them."""
        return _backward_functions(self)

    def resources(self) -> list[dict]:
        """What the compiler gave each of the three kernels."""
        threads = (ELEMENTWISE_THREADS, self.threads, ELEMENTWISE_THREADS)
        shared = (0, self.shared_bytes, 0)
        return [resources(kernel, expression, count, dynamic)
                for expression, kernel, count, dynamic in zip(self.name_expressions, self.functions(), threads, shared)]


@functools.cache
def _backward_functions(kernels: Flash2BackwardKernels):
    """Flash2BackwardKernels.functions, once per process: launches in a timed loop pay no checks."""
    capability = int(import_cupy().cuda.Device().compute_capability)  # "90" for 9.0
    if capability < BACKWARD_MIN_COMPUTE_CAPABILITY:
        raise ValueError(f"the backward kernels need compute capability {BACKWARD_MIN_COMPUTE_CAPABILITY // 10}.0 "
                         f"or newer (stmatrix, vector atomics); this GPU is {capability // 10}.{capability % 10}")
    what = f"flash2_backward with block_q={kernels.block_q}, block_kv={kernels.block_kv}, d={kernels.d}"
    if kernels.shared_bytes > device_shared_bytes():  # refused before compiling what cannot launch
        raise ValueError(f"{what} needs {kernels.shared_bytes} bytes of shared memory per CTA; this GPU allows "
                         f"{device_shared_bytes()}: choose smaller tiles (supported: {supported()})")
    preprocess, main, convert = (compiled(name, expression) for name, expression in zip(
        ("flash2_backward_preprocess.cu", "flash2_backward.cu", "flash2_backward_convert.cu"),
        kernels.name_expressions))
    return preprocess, _fit_shared(main, kernels.shared_bytes, what), convert


@attrs.frozen
class SoftmaxKernel:
    """One instantiation of naive_softmax.cu (kernel 2 of the naive path)."""

    dtype: str = "float16"
    instrumented: bool = False

    def __attrs_post_init__(self) -> None:
        _choice("dtype", self.dtype, STORAGE_TYPES)

    @property
    def name_expression(self) -> str:
        return f"naive_softmax<{STORAGE_TYPES[self.dtype]}, {'true' if self.instrumented else 'false'}>"

    def function(self, n_kv: int):
        """The compiled kernel with room for one row of n_kv scores in shared memory."""
        what = f"naive_softmax with n_kv={n_kv} (one row of S in shared memory)"
        return _fit_shared(compiled("naive_softmax.cu", self.name_expression), n_kv * 2, what)


def supported() -> dict:
    """The configurations the GPU kernels are instantiated for, by argument (Flash-Decoding: d and its
    KV tile; the backward's apart)."""
    return {"dtype": list(STORAGE_TYPES), "d": list(HEAD_DIMS), "block_q": list(BLOCK_Q), "block_kv": list(BLOCK_KV),
            "decode": {"d": list(DECODE_BLOCK_KV), "block_q": DECODE_BLOCK_Q,
                       "block_kv": {str(d): list(b) for d, b in DECODE_BLOCK_KV.items()}},
            "backward": {"d": list(BACKWARD_HEAD_DIMS), "block_q": list(BACKWARD_BLOCK_Q),
                         "block_kv": list(BACKWARD_BLOCK_KV)}}


def device_info() -> dict:
    """The current GPU and the software that drives it, for the records."""
    cupy = import_cupy()
    runtime = cupy.cuda.runtime
    device = cupy.cuda.Device()
    props = runtime.getDeviceProperties(device.id)
    return {
        "name": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "compute_capability": device.compute_capability,
        "sm_count": int(props["multiProcessorCount"]),
        "l2_bytes": int(props["l2CacheSize"]),
        "shared_bytes_per_block_optin": device_shared_bytes(),
        "driver_version": runtime.driverGetVersion(),
        "runtime_version": runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
    }
