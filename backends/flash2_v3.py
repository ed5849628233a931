"""FA-2 forward, version 3: the kernel of flash2_forward_v3.cu, FlashAttention-3's layout of the same
algorithm on a Hopper GPU (a TMA producer warpgroup feeding two wgmma consumer warpgroups, ping-pong
between the consumers). Same schedule and byte counts as versions 1 and 2; its arguments differ: the
kernel reads Q, K, V and writes O through tensor maps.

The kernel uses sm_90a instructions (wgmma, setmaxnreg), which only a compile for that exact target
emits; CuPy's RawModule always names the device's plain target itself (and NVRTC refuses a second
-arch), so this module compiles through CuPy's NVRTC binding and loads the cubin as a RawModule.

The tensor maps (CUtensorMap, 128 bytes each) are encoded on the host by the driver's
cuTensorMapEncodeTiled and copied to global memory, where the kernel reads them after a proxy fence;
they are cached per (buffer, shape), so a timed launch is the kernel call alone.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import tempfile

import attrs
import numpy as np

from simflash.backends.kernels import COMPILE_OPTIONS, STORAGE_TYPES, Flash2Kernel, _choice, _fit_shared, import_cupy
from simflash.backends.kernels import kernel_source

SOURCE = "flash2_forward_v3.cu"
HEAD_DIMS = (64, 128)
BLOCK_Q = (128,)  # two consumer warpgroups of 64 rows
BLOCK_KV = (64, 128)  # the N of one wgmma: 64 or 128 keys
CHOICES: dict[str, list] = {"dtype": list(STORAGE_TYPES), "d": list(HEAD_DIMS), "block_q": list(BLOCK_Q), "block_kv": list(BLOCK_KV)}
THREADS = 384  # producer warpgroup, two consumer warpgroups
KV_STAGES = 2  # V3_KV_STAGES in the kernel: K_j and V_j buffers in flight
BOX = 64  # columns per TMA box: 128 bytes, the swizzle's row
ALIGN_SLACK = 1024  # the kernel aligns its tiles to the 1024-byte swizzle atom
COMPUTE_CAPABILITY = 90  # sm_90a code runs on compute capability 9.0 only
# cuTensorMapEncodeTiled's enums (cuda.h): data type by storage dtype, 128-byte swizzle, 256-byte L2
# promotion, out-of-bounds elements read as zeros.
TMA_DATA_TYPE = {"float16": 6, "bfloat16": 9}
TMA_SWIZZLE_128B = 3
TMA_L2_PROMOTION_256B = 3
MAP_BYTES = 128


@functools.cache
def _compiled(name_expression: str):
    """The RawKernel of one instantiation, compiled by NVRTC for sm_90a."""
    cupy = import_cupy()
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(kernel_source(SOURCE), SOURCE, (), ())
    try:
        nvrtc.addNameExpression(program, name_expression)
        try:
            nvrtc.compileProgram(program, (*COMPILE_OPTIONS, "-ftz=true", "--device-as-default-execution-space",
                                           "-arch=sm_90a"))
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"NVRTC could not compile {name_expression}:\n{nvrtc.getProgramLog(program)}") from error
        lowered = nvrtc.getLoweredName(program, name_expression)
        cubin = nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)
    folder = os.path.join(tempfile.gettempdir(), f"simflash-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha256(cubin).hexdigest()[:24] + ".cubin")
    with tempfile.NamedTemporaryFile(dir=folder, delete=False) as file:  # whole, or not there: processes share it
        file.write(cubin)
    os.replace(file.name, path)
    return cupy.RawModule(path=path).get_function(lowered)


@functools.cache
def _function(name_expression: str, dynamic_bytes: int, what: str):
    capability = int(import_cupy().cuda.Device().compute_capability)
    if capability != COMPUTE_CAPABILITY:
        raise ValueError(f"kernel version v3 is built for compute capability 9.0 (Hopper: wgmma, TMA); this GPU is "
                         f"{capability // 10}.{capability % 10} (use version v1 or v2)")
    return _fit_shared(_compiled(name_expression), dynamic_bytes, what)


@functools.cache
def _encoder():
    library = ctypes.CDLL("libcuda.so.1")
    encode = library.cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return encode


def encode_tensor_map(address: int, heads: int, n: int, d: int, box_rows: int, dtype: str) -> bytes:
    """The 128-byte CUtensorMap of a contiguous (heads, n, d) 16-bit tensor at `address`, read and
    written in boxes of box_rows x 64 values of one head, swizzled 128 bytes."""
    storage = (ctypes.c_uint8 * (MAP_BYTES + 64))()  # the map must sit on 64 bytes
    at = (ctypes.addressof(storage) + 63) & ~63
    dims = (ctypes.c_uint64 * 3)(d, n, heads)
    strides = (ctypes.c_uint64 * 2)(d * 2, n * d * 2)  # bytes, from the second dimension on
    box = (ctypes.c_uint32 * 3)(BOX, box_rows, 1)
    steps = (ctypes.c_uint32 * 3)(1, 1, 1)
    result = _encoder()(at, TMA_DATA_TYPE[dtype], 3, address, dims, strides, box, steps, 0, TMA_SWIZZLE_128B,
                        TMA_L2_PROMOTION_256B, 0)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {result} for a ({heads}, {n}, {d}) tensor, "
                           f"boxes of {box_rows} x {BOX}")
    return ctypes.string_at(at, MAP_BYTES)


@functools.lru_cache(maxsize=64)
def _maps(addresses: tuple[int, int, int, int], heads: int, n_q: int, n_kv: int, d: int, block_kv: int, dtype: str):
    """The device copy of the four maps Q, K, V (loads) and O (store, 64 rows: one consumer's)."""
    q, k, v, o = addresses
    blob = b"".join((encode_tensor_map(q, heads, n_q, d, BLOCK_Q[0], dtype),
                     encode_tensor_map(k, heads, n_kv, d, block_kv, dtype),
                     encode_tensor_map(v, heads, n_kv, d, block_kv, dtype),
                     encode_tensor_map(o, heads, n_q, d, BLOCK_Q[0] // 2, dtype)))
    return import_cupy().asarray(np.frombuffer(blob, dtype=np.uint8))


def tensor_maps(kernel: Flash2V3Kernel, Q, K, V, O):
    """The tensor maps of device arrays Q, O (H, n_q, d) and K, V (H, n_kv, d) for `kernel`."""
    heads, n_q, d = Q.shape
    return _maps((Q.data.ptr, K.data.ptr, V.data.ptr, O.data.ptr), heads, n_q, K.shape[1], d, kernel.block_kv,
                 kernel.dtype)


@attrs.frozen
class Flash2V3Kernel(Flash2Kernel):
    """One instantiation of flash2_forward_v3.cu: storage dtype, B_r (128), B_c, head dim, the build,
    and whether the two consumer warpgroups take turns at the tensor cores (ping-pong)."""

    pingpong: bool = True

    def __attrs_post_init__(self) -> None:
        for name, choices in CHOICES.items():
            _choice(name, getattr(self, name), choices)
        if not isinstance(self.pingpong, bool):
            raise ValueError(f"pingpong must be True or False, got {self.pingpong!r}")

    @property
    def name_expression(self) -> str:
        flag = {True: "true", False: "false"}
        return (f"flash2_forward_v3<{STORAGE_TYPES[self.dtype]}, {self.block_kv}, {self.d}, {flag[self.pingpong]}, "
                f"{flag[self.instrumented]}>")

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: Q_i, and KV_STAGES buffers each of K_j and V_j, 2 bytes a value, plus
        the slack that aligns them to 1024 bytes."""
        return ALIGN_SLACK + (self.block_q + 2 * KV_STAGES * self.block_kv) * self.d * 2

    def function(self):
        """The compiled kernel, its shared-memory limit raised once per configuration."""
        what = f"flash2_forward_v3 with block_q={self.block_q}, block_kv={self.block_kv}, d={self.d}"
        return _function(self.name_expression, self.shared_bytes, what)


@attrs.frozen
class Flash2V3NoPingPongKernel(Flash2V3Kernel):
    """Version 3 without ping-pong: each consumer issues its products as soon as its tiles are in, so the
    two softmaxes are not kept apart from the other's products (the lever's before)."""

    pingpong: bool = False


def supported() -> dict:
    """The configurations version 3 is instantiated for, by argument."""
    return {name: list(choices) for name, choices in CHOICES.items()}
