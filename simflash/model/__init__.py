"""Closed-form models and analysis: traffic, Amdahl (roofline and footprint live beside them)."""

from simflash.model.amdahl import amdahl
from simflash.model.traffic import (
    FLASH_TRAFFIC,
    flash_traffic,
    idealized_causal_naive_traffic,
    kv_passes,
    naive_traffic,
    permitted_entries,
)

__all__ = [
    "FLASH_TRAFFIC", "amdahl", "flash_traffic", "idealized_causal_naive_traffic", "kv_passes",
    "naive_traffic", "permitted_entries",
]
