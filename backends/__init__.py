"""The GPU backend: the FA-2 forward kernel (grouped-query heads, sliding windows; two versions), its
three backward kernels, Flash-Decoding's split and combine kernels, and the naive three-kernel path on
a real NVIDIA GPU.

Kernels are CUDA sources shipped as package data (flash2_forward.cu and its version 2,
flash2_forward_v2.cu; flash2_backward_preprocess.cu, flash2_backward.cu, flash2_backward_convert.cu;
flash_decoding_split.cu, flash_decoding_combine.cu; naive_softmax.cu; flash2_tile.cuh, ptx.cuh),
compiled through CuPy's RawModule. CuPy is imported lazily: importing this package needs no GPU.

    from simflash.backends import flash_attention, flash_attention_backward, flash_decoding, naive_attention
    run = flash_attention(q, k, v, causal=True)   # instrumented: run.traffic == sf.flash_attention(...).traffic
    grads = flash_attention_backward(q, k, v, do, causal=True)   # .dq .dk .dv, .traffic by kernel
    run = flash_decoding(q, k, v)                 # run.traffic == sf.model.flash_decoding_traffic(...)
"""

from simflash.backends.flash2 import VERSIONS, GPURun, TileStats, flash_attention
from simflash.backends.flash2_backward import GPUBackwardRun, flash_attention_backward
from simflash.backends.flash2_v2 import Flash2V2Kernel
from simflash.backends.decoding import flash_decoding
from simflash.backends.kernels import (
    DecodeCombineKernel,
    DecodeSplitKernel,
    Flash2BackwardKernels,
    Flash2Kernel,
    SoftmaxKernel,
    gpu_available,
    supported,
)
from simflash.backends.naive import naive_attention

__all__ = ["VERSIONS", "DecodeCombineKernel", "DecodeSplitKernel", "Flash2BackwardKernels", "Flash2Kernel",
           "Flash2V2Kernel", "GPUBackwardRun", "GPURun", "SoftmaxKernel", "TileStats", "flash_attention",
           "flash_attention_backward", "flash_decoding", "gpu_available", "naive_attention", "supported"]
