"""The tiled attention algorithms, by variant name. The CLI's choices come from this registry."""

from simflash.algorithms.flash1 import flash1_forward
from simflash.algorithms.flash2 import flash2_forward

# Each entry: forward(gpu, sched, scale, trace, write_logsumexp) -> iterator of TileStep.
FLASH_ALGORITHMS = {
    "fa2": flash2_forward,
    "fa1": flash1_forward,
}
