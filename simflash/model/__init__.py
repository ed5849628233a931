"""Closed-form models and analysis: traffic, roofline, Amdahl, latency attribution, footprint, sweeps."""

from simflash.model import physical as physical  # the whole-chip model, as sf.model.physical
from simflash.model.amdahl import amdahl, attention_flop_share, project, sensitivity
from simflash.model.backward import backward_flops_by_kind, flash_backward_traffic, naive_backward_traffic
from simflash.model.decode import (
    decode_launch,
    flash_decoding_flops,
    flash_decoding_traffic,
    num_splits_heuristic,
    predict_decode,
)
from simflash.model.decode_chip import predict_decode_dram
from simflash.model.flops import flops_by_kind
from simflash.model.footprint import fused_footprints, intermediate_footprints, short_sequence
from simflash.model.report import attribute, load_scenario, parse_scenario, render_report
from simflash.model.roofline import INTENSITY_MODELS, attention_flops, conclusion, intensity_table, roof
from simflash.model.sweep import fa1_tile_sizes, traffic_vs_n, traffic_vs_sram
from simflash.model.traffic import (
    FLASH_TRAFFIC,
    flash_traffic,
    idealized_causal_naive_traffic,
    kv_passes,
    naive_traffic,
    permitted_entries,
)

__all__ = [
    "FLASH_TRAFFIC", "INTENSITY_MODELS", "amdahl", "attention_flop_share", "attention_flops", "attribute",
    "backward_flops_by_kind", "conclusion", "decode_launch", "fa1_tile_sizes", "flash_backward_traffic",
    "flash_decoding_flops", "flash_decoding_traffic", "flash_traffic", "flops_by_kind", "fused_footprints",
    "idealized_causal_naive_traffic", "intensity_table", "intermediate_footprints", "kv_passes", "load_scenario",
    "naive_backward_traffic", "naive_traffic", "num_splits_heuristic", "parse_scenario", "permitted_entries",
    "predict_decode", "predict_decode_dram", "project", "render_report", "roof", "sensitivity", "short_sequence", "traffic_vs_n",
    "traffic_vs_sram",
]
