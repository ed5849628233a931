"""Naive attention on a real GPU: the three kernels of simflash/algorithms/naive.py, S and P in HBM.

    kernel 1 (gemm_qk, cuBLAS):            S = scale * Q K^T     reads Q, K   writes S
    kernel 2 (softmax, naive_softmax.cu):  P = softmax(S)        reads S      writes P
    kernel 3 (gemm_pv, cuBLAS):            O = P V               reads P, V   writes O

S and P are stored in the storage dtype; the GEMMs take 16-bit operands and accumulate in fp32 on
the tensor cores (cublasGemmStridedBatchedEx, called directly: cupy.matmul would convert float16 to
float32 first, adding kernels and traffic). Causal: the softmax reads and writes only the permitted
entries, as the simulator does; the GEMMs are dense (cuBLAS has no triangular output), so they write
all of S and read all of P, whose never-written entries stay the zeros P was allocated with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from simflash.api import prepare_inputs
from simflash.backends.flash2 import GPURun, device_view, poisoned_output
from simflash.backends.kernels import SOFTMAX_THREADS, STORAGE_TYPES, SoftmaxKernel, import_cupy
from simflash.memory import Flow, Traffic
from simflash.schedule import TileSchedule

if TYPE_CHECKING:
    from simflash.backends.kernels import DeviceArray

NAIVE_DTYPES = tuple(STORAGE_TYPES)  # the 16-bit storage dtypes cuBLAS and the softmax take


def check_dtype(dtype: str) -> None:
    if dtype not in NAIVE_DTYPES:
        raise ValueError(f"dtype must be one of {list(NAIVE_DTYPES)} for the naive GPU path, got {dtype!r}")


def gemm(dtype: str, transa: bool, m: int, n: int, k: int, alpha: float, A, lda: int, B, ldb: int, C, ldc: int) -> None:
    """Per head h: C_h = alpha * op(A_h) B_h in cuBLAS's column-major terms (op: transpose when
    `transa`), 16-bit in and out, fp32 accumulation. A, B, C: contiguous (H, ...) device arrays."""
    cupy = import_cupy()
    from cupy_backends.cuda.libs import cublas

    data_type = {"float16": cupy.cuda.runtime.CUDA_R_16F, "bfloat16": cupy.cuda.runtime.CUDA_R_16BF}[dtype]
    heads = A.shape[0]
    one, zero = np.array(alpha, dtype=np.float32), np.array(0.0, dtype=np.float32)
    cublas.gemmStridedBatchedEx(
        cupy.cuda.Device().cublas_handle, cublas.CUBLAS_OP_T if transa else cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N,
        m, n, k, one.ctypes.data,
        A.data.ptr, data_type, lda, A.size // heads,
        B.data.ptr, data_type, ldb, B.size // heads,
        zero.ctypes.data,
        C.data.ptr, data_type, ldc, C.size // heads,
        heads, cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT,
    )


@attrs.define
class NaivePath:
    """Device buffers and kernels of one naive configuration; `run()` launches the three kernels."""

    Q: DeviceArray  # (H, n_q, d) 16-bit device array
    K: DeviceArray  # (H, n_kv, d)
    V: DeviceArray  # (H, n_kv, d)
    sched: TileSchedule
    scale: float
    dtype: str = "float16"
    instrumented: bool = False
    S: DeviceArray = attrs.field(init=False)  # (H, n_q, n_kv) scale * Q K^T
    P: DeviceArray = attrs.field(init=False)  # (H, n_q, n_kv) probabilities, zeros where never stored
    O: DeviceArray = attrs.field(init=False)  # (H, n_q, d)
    counters: DeviceArray = attrs.field(init=False)  # instrumented: [S read, P written] by the softmax

    def __attrs_post_init__(self) -> None:
        check_dtype(self.dtype)
        cupy = import_cupy()
        heads, n_q, _ = self.Q.shape
        n_kv = self.K.shape[1]
        self.S = cupy.empty((heads, n_q, n_kv), dtype=cupy.uint16)
        self.P = cupy.zeros((heads, n_q, n_kv), dtype=cupy.uint16)
        self.O = poisoned_output(self.Q.shape, self.dtype)
        self.counters = cupy.zeros(2, dtype=cupy.uint64)

    def run(self) -> None:
        heads, n_q, d = self.Q.shape
        n_kv = self.K.shape[1]
        softmax = SoftmaxKernel(self.dtype, self.instrumented).function(n_kv)
        # Row-major S (n_q, n_kv) is column-major S^T = K Q^T: K's rows read as columns, transposed.
        gemm(self.dtype, True, n_kv, n_q, d, self.scale, self.K, d, self.Q, d, self.S, n_kv)  # kernel 1
        softmax(  # kernel 2
            (heads * n_q,), (SOFTMAX_THREADS,),
            (self.S, self.P, np.int32(n_q), np.int32(n_kv), np.int32(self.sched.causal),
             np.int32(self.sched.diagonal_offset), self.counters if self.instrumented else np.uint64(0)),
            shared_mem=n_kv * 2,
        )
        # Row-major O (n_q, d) is column-major O^T = V^T P^T.
        gemm(self.dtype, False, d, n_q, n_kv, 1.0, self.V, d, self.P, n_kv, self.O, d)  # kernel 3

    def traffic(self) -> Traffic:
        """The path's ledger: the softmax's entries counted on the device (instrumented), the GEMMs'
        the bytes a dense GEMM reads and writes, each operand once."""
        heads, n_q, d = self.Q.shape
        n_kv = self.K.shape[1]
        b = 2
        read_S, written_P = (int(c) for c in self.counters.get())
        return Traffic({
            ("gemm_qk", "Q"): Flow(read_bytes=heads * n_q * d * b),
            ("gemm_qk", "K"): Flow(read_bytes=heads * n_kv * d * b),
            ("gemm_qk", "S"): Flow(write_bytes=heads * n_q * n_kv * b),
            ("softmax", "S"): Flow(read_bytes=read_S),
            ("softmax", "P"): Flow(write_bytes=written_P),
            ("gemm_pv", "P"): Flow(read_bytes=heads * n_q * n_kv * b),
            ("gemm_pv", "V"): Flow(read_bytes=heads * n_kv * d * b),
            ("gemm_pv", "O"): Flow(write_bytes=heads * n_q * d * b),
        })


def naive_attention(
    q, k, v, causal: bool = False, causal_variant: str = "upper_left", scale: float | None = None,
    dtype: str = "float16", *, instrumented: bool = True,
) -> GPURun:
    """The three-kernel naive path on the GPU; same checks and shapes as simflash.naive_attention."""
    check_dtype(dtype)
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    sched = TileSchedule(Q.shape[1], K.shape[1], Q.shape[1], K.shape[1], causal=bool(causal),
                         causal_variant=causal_variant)
    path = NaivePath(device_view(Q, dtype), device_view(K, dtype), device_view(V, dtype), sched, scale, dtype,
                     bool(instrumented))
    path.run()
    out = path.O.get().view(Q.dtype).reshape(np.shape(q))
    counted = frozenset({("softmax", "S"), ("softmax", "P")}) if instrumented else frozenset()
    return GPURun(out=out, traffic=path.traffic() if instrumented else None, counted=counted, trace=(),
                  resources={"kernels": ["cublasGemmStridedBatchedEx", SoftmaxKernel(dtype, bool(instrumented)).name_expression,
                                         "cublasGemmStridedBatchedEx"]})
