"""Measured DRAM bytes and times, set beside a physical prediction (`simflash physical --measured`).

Three kinds of file are read, each for the configuration a prediction was made for:

- an Nsight Compute CSV report (`ncu --csv --print-units base`, with dram__bytes_read.sum,
  dram__bytes_write.sum and optionally gpu__time_duration.sum) of one configuration's kernels. Kernel
  names map to the ledger's: a name holding "softmax" is the softmax, the kernels before it are
  gemm_qk and those after it gemm_pv (cuBLAS may launch several; they are summed); a name holding
  "flash" (flash2_forward, pytorch_flash::flash_fwd_kernel) is flash2_forward, or, where PyTorch ran
  the grid split-KV, flash_fwd_splitkv_kernel and flash_fwd_splitkv_combine_kernel are the
  flash_decoding_split and flash_decoding_combine kernels; the sweep's marker kernel
  (simflash_group_marker) is skipped;
- the calibration sweep's JSON (`simflash gpu calibrate --save`, benchmarks/gpu/calibration_*.json):
  the configuration matching the prediction's, "fa2" for simflash's kernel, "sdpa_flash" for PyTorch's;
- the older profile JSON (`simflash gpu profile --save`, benchmarks/gpu/profile.json; cold caches).

Errors are ValueErrors whose message says what is wrong with the file.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from simflash.algorithms.flash2 import KERNEL as FA2_KERNEL
from simflash.algorithms.flash_decoding_combine import KERNEL as COMBINE_KERNEL
from simflash.algorithms.flash_decoding_split import KERNEL as SPLIT_KERNEL

MARKER_KERNEL = "simflash_group_marker"
NCU_METRICS = {"dram_read_bytes": "dram__bytes_read.sum", "dram_write_bytes": "dram__bytes_write.sum"}
NCU_TIME = "gpu__time_duration.sum"
TIME_UNITS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
              "s": 1.0, "second": 1.0}
COMPARED = ("dram_read_bytes", "dram_write_bytes", "time_s")

Measured = dict[str, dict]  # ledger kernel name -> {"dram_read_bytes", "dram_write_bytes", "time_s" (or None)}


def load_measured(path: str | Path, config: dict) -> tuple[Measured, str]:
    """The measured kernels of the configuration `config` (a PhysicalPrediction's config) in the file,
    and the kind of file it was: "ncu_csv", "calibration" or "profile"."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no such file: {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _from_ncu_csv(text, path, config), "ncu_csv"
    if not isinstance(data, dict) or not isinstance(data.get("configs"), list):
        raise ValueError(f"{path} is JSON but not a calibration or profile result (no 'configs' list)")
    configs = [entry for entry in data["configs"] if isinstance(entry, dict) and isinstance(entry.get("config"), dict)]
    if any("algorithm" in entry["config"] for entry in configs):
        return _from_calibration(data, configs, path, config), "calibration"
    return _from_profile(configs, path, config), "profile"


def compare(prediction_kernels: list[dict], measured: Measured) -> list[dict]:
    """Each predicted kernel's dict with measured_* and *_error (relative: (predicted - measured) /
    measured; None where not measured, or where the measured value is 0 and the prediction is not)."""
    rows = []
    for kernel in prediction_kernels:
        row = dict(kernel)
        seen = measured.get(kernel["kernel"], {})
        for key in COMPARED:
            value = seen.get(key)
            row[f"measured_{key}"] = value
            row[f"{key}_error"] = relative_error(kernel[key], value)
        rows.append(row)
    return rows


def relative_error(predicted: float, measured: float | None) -> float | None:
    if measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - measured) / measured


def _algorithm(config: dict) -> str:
    """The name a measurement file gives the configuration's implementation."""
    if config["algorithm"] == "naive":
        return "naive"
    return "fa2" if config.get("kernel", "simflash") == "simflash" else "sdpa_flash"


def _describe(config: dict) -> str:
    keys = ("n", "n_kv", "heads", "d", "causal", "dtype")
    text = f"algorithm={_algorithm(config)} " + " ".join(f"{key}={config[key]}" for key in keys if key in config)
    if config["algorithm"] != "naive":
        text += f" block_q={config['block_q']} block_kv={config['block_kv']}"
    return text


def _matches(recorded: dict, config: dict, algorithm: str) -> bool:
    """Does a configuration recorded in a measurement file describe the prediction's? Recorded
    configurations name no dtype (float16), no n_kv (= n) and, unless causal, no causal variant."""
    want = {"n": config["n"], "heads": config["heads"], "d": config["d"], "causal": config["causal"]}
    if any(recorded.get(key) != value for key, value in want.items()):
        return False
    if recorded.get("n_kv", recorded["n"]) != config["n_kv"] or recorded.get("dtype", "float16") != config["dtype"]:
        return False
    if config["causal"] and recorded.get("causal_variant", "upper_left") != config["causal_variant"]:
        return False
    if algorithm == "fa2":  # our kernel ran the recorded tiles; SDPA's chooses its own
        return (recorded.get("block_q"), recorded.get("block_kv")) == (config["block_q"], config["block_kv"])
    return True


def _no_match(path: Path, config: dict, candidates: list[dict]) -> ValueError:
    shown = "; ".join(" ".join(f"{k}={v}" for k, v in c.items()) for c in candidates[:6])
    more = f" (and {len(candidates) - 6} more)" if len(candidates) > 6 else ""
    listing = f"; it has for this algorithm: {shown}{more}" if candidates else "; it has none for this algorithm"
    return ValueError(f"no configuration in {path} matches {_describe(config)}{listing}")


def _kernel_values(entry: dict, path: Path, time_key: str, time_scale: float) -> dict:
    try:
        time = entry.get(time_key)
        return {"dram_read_bytes": int(entry["dram_read_bytes"]), "dram_write_bytes": int(entry["dram_write_bytes"]),
                "time_s": None if time is None else float(time) * time_scale}
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: kernel {entry.get('kernel')!r} lacks dram_read_bytes/dram_write_bytes "
                         "as numbers") from None


def _check_cache(recorded: object, path: Path, config: dict) -> None:
    if recorded is not None and recorded != config["cache"]:
        raise ValueError(f"{path} was measured with {recorded} caches, the prediction is for "
                         f"--cache {config['cache']}: pass --cache {recorded}")


def _from_calibration(data: dict, configs: list[dict], path: Path, config: dict) -> Measured:
    _check_cache(data.get("cache"), path, config)
    algorithm = _algorithm(config)
    candidates = [entry for entry in configs if entry["config"].get("algorithm") == algorithm]
    for entry in candidates:
        if _matches(entry["config"], config, algorithm):
            return {k["kernel"]: _kernel_values(k, path, "time_s", 1.0) for k in entry.get("kernels", [])
                    if isinstance(k, dict) and "kernel" in k}
    raise _no_match(path, config, [{k: v for k, v in e["config"].items() if k != "algorithm"} for e in candidates])


def _from_profile(configs: list[dict], path: Path, config: dict) -> Measured:
    """`simflash gpu profile` ran our FA-2 kernel (and the naive path where config.naive) under ncu
    with every cache flushed before each kernel."""
    _check_cache("cold", path, config)
    algorithm = _algorithm(config)
    if algorithm == "sdpa_flash":
        raise ValueError(f"{path} is a `simflash gpu profile` result: it measured simflash's kernel, not SDPA's "
                         "(use --kernel simflash, or the calibration JSON)")
    wanted = ("gemm_qk", "softmax", "gemm_pv") if algorithm == "naive" else ("flash2_forward",)
    candidates = [entry for entry in configs if algorithm == "fa2" or entry["config"].get("naive", True)]
    for entry in candidates:
        if _matches(entry["config"], config, algorithm):
            kernels = {k["kernel"]: k for k in entry.get("kernels", []) if isinstance(k, dict) and "kernel" in k}
            return {name: _kernel_values(kernels[name], path, "time_ns", 1e-9) for name in wanted if name in kernels}
    raise _no_match(path, config, [{k: v for k, v in e["config"].items() if k not in ("naive", "causal_variant")}
                                   for e in candidates])


def _ncu_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO("\n".join(line for line in text.splitlines() if line.startswith('"')))))


def _from_ncu_csv(text: str, path: Path, config: dict) -> Measured:
    from simflash.backends.profile import parse_ncu_csv

    rows = _ncu_rows(text)
    header = rows[0] if rows else []
    needed = ("ID", "Kernel Name", "Metric Name", "Metric Value")
    if not all(column in header for column in needed):
        raise ValueError(f"{path} is neither JSON nor an ncu CSV report (expected the columns {', '.join(needed)}; "
                         "write one with `ncu --csv --print-units base`)")
    try:
        kernels = parse_ncu_csv(text)
    except (ValueError, IndexError) as error:
        raise ValueError(f"{path}: cannot parse the ncu CSV report ({error})") from None
    time_scale = _units(rows, header, path)
    missing = [metric for metric in NCU_METRICS.values() if not any(metric in k["metrics"] for k in kernels)]
    if missing:
        raise ValueError(f"{path}: the ncu report has no {', '.join(missing)} (profile with --metrics "
                         f"{','.join(NCU_METRICS.values())},{NCU_TIME})")
    kernels = [k for k in kernels if k["name"] != MARKER_KERNEL and not k["name"].startswith(MARKER_KERNEL)]
    kinds = ["softmax" if "softmax" in k["name"].lower() else "flash" if "flash" in k["name"].lower() else "other"
             for k in kernels]
    if config["algorithm"] == "naive":
        softmax = [i for i, kind in enumerate(kinds) if kind == "softmax"]
        if len(softmax) != 1:
            raise ValueError(f"{path}: expected one softmax kernel (a name holding 'softmax') for the naive path, "
                             f"found {len(softmax)}; give a report of one configuration")
        at = softmax[0]
        stages = {"gemm_qk": [k for k, kind in zip(kernels[:at], kinds[:at]) if kind == "other"],
                  "softmax": [kernels[at]],
                  "gemm_pv": [k for k, kind in zip(kernels[at + 1:], kinds[at + 1:]) if kind == "other"]}
    else:
        flash = [k for k, kind in zip(kernels, kinds) if kind == "flash"]
        stages = {flash_stage(k["name"]): [k] for k in flash}
        if len(stages) != len(flash) or set(stages) not in ({FA2_KERNEL}, {SPLIT_KERNEL, COMBINE_KERNEL}):
            raise ValueError(f"{path}: expected one FlashAttention kernel (a name holding 'flash'), or a split-KV "
                             f"kernel and its combine, found {len(flash)}; give a report of one configuration")
    return {name: _sum_kernels(group, time_scale) for name, group in stages.items() if group}


def flash_stage(name: str) -> str:
    """The ledger name of a FlashAttention kernel: FA-2's split-KV pair (PyTorch's flash_fwd_splitkv_kernel
    and flash_fwd_splitkv_combine_kernel, or simflash's Flash-Decoding kernels) or flash2_forward."""
    name = name.lower()
    if "combine" in name:
        return COMBINE_KERNEL
    return SPLIT_KERNEL if "splitkv" in name or "decoding_split" in name else FA2_KERNEL


def _units(rows: list[list[str]], header: list[str], path: Path) -> float:
    """Check the byte counters are in bytes; the factor from the report's time unit to seconds."""
    if "Metric Unit" not in header:
        return 1e-9
    name_at, unit_at = header.index("Metric Name"), header.index("Metric Unit")
    units = {row[name_at]: row[unit_at] for row in rows[1:] if len(row) > max(name_at, unit_at)}
    for metric in NCU_METRICS.values():
        if units.get(metric, "byte") != "byte":
            raise ValueError(f"{path}: {metric} is in {units[metric]!r}, not bytes: write the report with "
                             "`ncu --csv --print-units base`")
    unit = units.get(NCU_TIME, "ns")
    if unit not in TIME_UNITS:
        raise ValueError(f"{path}: unknown time unit {unit!r} for {NCU_TIME} (use `ncu --print-units base`)")
    return TIME_UNITS[unit]


def _sum_kernels(group: list[dict], time_scale: float) -> dict:
    def total(metric: str) -> float:
        return sum(k["metrics"].get(metric, 0.0) for k in group)

    timed = all(NCU_TIME in k["metrics"] for k in group)
    return {"dram_read_bytes": int(total(NCU_METRICS["dram_read_bytes"])),
            "dram_write_bytes": int(total(NCU_METRICS["dram_write_bytes"])),
            "time_s": total(NCU_TIME) * time_scale if timed else None}
