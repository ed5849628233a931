"""The machine files: every one loads, keeps the figures of the table they replaced, and a broken
file is refused with an error naming the file and the key."""

import importlib.resources
import re

import pytest

import simflash as sf
from simflash.config import BUILTIN_MACHINES, GPUS, KiB, MiB, gpu_spec, load_machine

# The spec table as it stood in config.py before the machine files replaced it.
TABLE_BEFORE_MACHINE_FILES = {
    "A100": dict(name="A100 80GB SXM", peak_flops={"float16": 312e12, "bfloat16": 312e12, "float32": 19.5e12},
                 hbm_bytes_per_s=2.039e12, l2_bytes_per_s=7.0e12, sm_count=108, smem_carveout_bytes=164 * KiB,
                 l2_bytes=40 * MiB),
    "H100": dict(name="H100 SXM", peak_flops={"float16": 989e12, "bfloat16": 989e12, "float32": 67e12},
                 hbm_bytes_per_s=3.35e12, l2_bytes_per_s=12.0e12, sm_count=132, smem_carveout_bytes=228 * KiB,
                 l2_bytes=50 * MiB),
    "H200": dict(name="H200 SXM", peak_flops={"float16": 989e12, "bfloat16": 989e12, "float32": 67e12},
                 hbm_bytes_per_s=4.8e12, l2_bytes_per_s=12.0e12, sm_count=132, smem_carveout_bytes=228 * KiB,
                 l2_bytes=60 * MiB),
    "B200": dict(name="B200 SXM", peak_flops={"float16": 2250e12, "bfloat16": 2250e12, "float32": 80e12},
                 hbm_bytes_per_s=8.0e12, l2_bytes_per_s=20.0e12, sm_count=148, smem_carveout_bytes=228 * KiB,
                 l2_bytes=126 * MiB),
}


def machine_text(name: str) -> str:
    return (importlib.resources.files("simflash") / "machines" / f"{name}.toml").read_text(encoding="utf-8")


def test_every_shipped_machine_file_is_in_the_table():
    shipped = sorted(f.name for f in (importlib.resources.files("simflash") / "machines").iterdir()
                     if f.name.endswith(".toml"))
    assert shipped == sorted(f"{name}.toml" for name in BUILTIN_MACHINES)
    assert list(GPUS) == ["A100", "H100", "H200", "B200"]


@pytest.mark.parametrize("name", TABLE_BEFORE_MACHINE_FILES)
def test_figures_match_the_table_they_replaced(name):
    spec = gpu_spec(name)
    for field, value in TABLE_BEFORE_MACHINE_FILES[name].items():
        assert getattr(spec, field) == value, field
    assert spec.shared_bytes_per_sm == spec.smem_carveout_bytes


@pytest.mark.parametrize("name", BUILTIN_MACHINES)
def test_machine_file_loads_from_a_path(name, tmp_path):
    path = tmp_path / f"{name}.toml"
    path.write_text(machine_text(name), encoding="utf-8")
    assert sf.config.load_machine(path) == GPUS[name]
    assert load_machine(str(path)) == GPUS[name]


@pytest.mark.parametrize("name", BUILTIN_MACHINES)
def test_per_sm_figures_and_derived_rates(name):
    spec = GPUS[name]
    assert spec.max_warps_per_sm * 32 == spec.max_threads_per_sm
    assert spec.l2_line_bytes == 4 * spec.l2_sector_bytes
    assert spec.max_shared_bytes_per_cta + spec.shared_reserved_bytes_per_cta == spec.shared_bytes_per_sm
    assert spec.registers_per_sm % (spec.sub_partitions_per_sm * spec.register_alloc_unit_per_warp) == 0
    # The files state these as "derived: ..." from the lanes or units per SM per clock.
    fp32_lanes_per_sm = 64 if name == "A100" else 128
    assert spec.fp32_flops_per_s == pytest.approx(2 * fp32_lanes_per_sm * spec.sm_count * spec.clock_hz, rel=1e-12)
    assert spec.sfu_ops_per_s == pytest.approx(16 * spec.sm_count * spec.clock_hz, rel=1e-12)
    # The derived FP32 rate and the datasheet's agree to within its rounding.
    assert spec.fp32_flops_per_s == pytest.approx(spec.peak_flops["float32"], rel=0.01)
    if name != "H200":  # H200.toml carries the fitted [calibration] of `simflash gpu calibrate`
        assert spec.calibration == {}


def write(tmp_path, text):
    path = tmp_path / "broken.toml"
    path.write_text(text, encoding="utf-8")
    return path


def h200_with(old: str, new: str) -> str:
    text = machine_text("H200")
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize("old, new, message", [
    ("sm_count = 132", "", "missing key 'sm_count'"),
    ("float16 = 989e12", "", "missing key 'peak_flops.float16'"),
    ("sm_count = 132", 'sm_count = "132"', "key 'sm_count' must be a positive integer, got '132'"),
    ("sm_count = 132", "sm_count = 132.0", "key 'sm_count' must be a positive integer, got 132.0"),
    ("sm_count = 132", "sm_count = true", "key 'sm_count' must be a positive integer, got True"),
    ("sm_count = 132", "sm_count = 0", "key 'sm_count' must be a positive integer, got 0"),
    ("clock_hz = 1.98e9", 'clock_hz = "fast"', "key 'clock_hz' must be a positive number, got 'fast'"),
    ("clock_hz = 1.98e9", "clock_hz = nan", "key 'clock_hz' must be a positive number, got nan"),
    ('name = "H200 SXM"', "name = 200", "key 'name' must be a string, got 200"),
    ("float16 = 989e12", 'float16 = "989e12"', "key 'peak_flops.float16' must be a positive number"),
    ("[calibration]", "[calibration]\nl2_fraction = false", "key 'calibration.l2_fraction' must be a number >= 0"),
    ("[calibration]", "[calibration]\nl2_fraction = -0.5", "key 'calibration.l2_fraction' must be a number >= 0, got -0.5"),
    ("float16 = 989e12", "float16 = 0", "key 'peak_flops.float16' must be a positive number, got 0"),
    ("sm_count = 132", "sm_count = 132\nsm_cout = 132", "unknown key 'sm_cout'"),
    ("sm_count = 132", "sm_count = ", "not valid TOML"),
])
def test_broken_machine_file_names_file_and_key(tmp_path, old, new, message):
    path = write(tmp_path, h200_with(old, new))
    with pytest.raises(ValueError, match=r"machine file .*broken\.toml: ") as info:
        load_machine(path)
    assert message in str(info.value)


def test_peak_flops_must_be_a_table(tmp_path):
    text = machine_text("H200").split("[peak_flops]")[0] + "peak_flops = 1.0\n"  # a number, not a table
    with pytest.raises(ValueError, match=re.escape("broken.toml: key 'peak_flops' must be a table of numbers, got 1.0")):
        load_machine(write(tmp_path, text))


def test_calibration_is_read(tmp_path):
    path = write(tmp_path, h200_with("[calibration]", "[calibration]\nl2_effective_fraction = 0.8  # a sweep"))
    assert load_machine(path).calibration == {**GPUS["H200"].calibration, "l2_effective_fraction": 0.8}


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read machine file .*nope\.toml"):
        load_machine(tmp_path / "nope.toml")
