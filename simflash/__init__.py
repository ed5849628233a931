"""simflash: see where every byte of attention goes.

A pure-NumPy simulated GPU (HBM and SRAM that count every byte) running naive and tiled
FlashAttention step by step, closed-form traffic models that agree with it exactly, and analysis.

Docstrings cite two texts by section: "the lesson" is *FlashAttention and GPU Data Movement*, whose
configuration (N = 4096, d = 128, fp16, B_r = 128, B_c = 64) gives the defaults; "the roofline
lecture" is *Lecture 1 - Attention Bottleneck and Roofline*.
"""

from simflash import model
from simflash._checkout import register as _register_checkout_backends
from simflash.api import Run, RunConfig, flash_attention, flash_attention_steps, naive_attention
from simflash.backward import BackwardRun, flash_attention_backward, naive_attention_backward
from simflash.config import GPUS, GPUSpec
from simflash.decoding import flash_decoding
from simflash.memory import HBM, SRAM, Flow, SRAMOverflowError, Traffic
from simflash.model.amdahl import amdahl
from simflash.schedule import TileSchedule
from simflash.trace import TileStep, Trace
from simflash.trace_backward import BackwardStep, BackwardTrace

__all__ = [
    "BackwardRun", "BackwardStep", "BackwardTrace", "GPUS", "GPUSpec", "HBM", "SRAM", "Flow", "Run", "RunConfig",
    "SRAMOverflowError", "TileSchedule", "TileStep", "Trace", "Traffic", "amdahl", "flash_attention",
    "flash_attention_backward", "flash_attention_steps", "flash_decoding", "model", "naive_attention",
    "naive_attention_backward",
]

# Imported from a checkout, map simflash.backends to its backends/ (that one name, not the checkout root on __path__).
_register_checkout_backends()
