"""`simflash physical`: the prediction as JSON, measured bytes set beside it, bad input, pictures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simflash import plots
from simflash.cli import app
from simflash.model.measured import load_measured, relative_error
from simflash.model.physical import predict

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "benchmarks" / "gpu" / "calibration_cold.json"
PROFILE = REPO / "benchmarks" / "gpu" / "profile.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()
WIDE = {"COLUMNS": "200"}
BYTE_KEYS = ("logical_read_bytes", "logical_write_bytes", "l2_hit_bytes", "dram_read_bytes", "dram_write_bytes",
             "spill_write_bytes")


def invoke(*args: str):
    return runner.invoke(app, ["physical", *args], env=WIDE)


def flat(text: str) -> str:
    """The output with rich's panel borders and line breaks folded away, for matching messages."""
    return " ".join(text.replace("│", " ").replace("╭", " ").replace("╰", " ").split())


def ncu_csv(kernels: list[tuple[str, int, int, int]], byte_unit: str = "byte") -> str:
    """An ncu --csv --print-units base report: (name, DRAM read, DRAM write, time ns) per kernel."""
    lines = ['==PROF== Connected to process 1 (python)',
             '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
             '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"']
    for i, (name, read, write, ns) in enumerate(kernels):
        for metric, unit, value in (("dram__bytes_read.sum", byte_unit, read),
                                    ("dram__bytes_write.sum", byte_unit, write),
                                    ("gpu__time_duration.sum", "ns", ns)):
            lines.append(f'"{i}","1","python","127.0.0.1","{name}","1","7","(128, 1, 1)","(32, 1, 1)","0","9.0",'
                         f'"Command line profiler metrics","{metric}","{unit}","{value:,}"')
    return "\n".join(lines) + "\n"


NAIVE_KERNELS = [
    ("simflash_group_marker", 3328, 0, 2048),
    ("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", 1_000_000, 2_000_000, 10_000),
    ("cublasLt::splitKreduce_kernel", 500, 700, 1_000),
    ("void naive_softmax<0, 0>(const unsigned short *, unsigned short *, int)", 33_000_000, 12_000_000, 20_000),
    ("nvjet_sm90_hsh_64x64_64x13_2x1_v_bz_NNT", 34_000_000, 700_000, 13_000),
]


def test_json_has_the_documented_keys_and_integer_bytes():
    result = invoke("--n", "512", "--d", "64", "--heads", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"kernels", "config", "notes"} and data["notes"] == []
    assert [k["kernel"] for k in data["kernels"]] == ["flash2_forward"]
    kernel = data["kernels"][0]
    for key in BYTE_KEYS:
        assert isinstance(kernel[key], int) and kernel[key] >= 0, key
    assert isinstance(kernel["time_s"], float) and kernel["time_s"] > 0
    assert data["config"]["n"] == 512 and data["config"]["heads"] == 2 and data["config"]["kernel"] == "simflash"
    expected = predict("fa2", 512, 64, heads=2).kernel("flash2_forward")
    assert all(kernel[key] == getattr(expected, key) for key in BYTE_KEYS)


def test_naive_json_has_three_kernels_whose_logical_bytes_are_the_ledger():
    import simflash as sf

    data = json.loads(invoke("--algorithm", "naive", "--n", "256", "--cache", "warm", "--json").output)
    assert [k["kernel"] for k in data["kernels"]] == ["gemm_qk", "softmax", "gemm_pv"]
    ledger = sf.model.naive_traffic(256, 128).by_kernel
    for k in data["kernels"]:
        assert (k["logical_read_bytes"], k["logical_write_bytes"]) == (
            ledger[k["kernel"]].read_bytes, ledger[k["kernel"]].write_bytes)
    assert data["config"]["cache"] == "warm"


def test_table_names_every_kernel():
    result = invoke("--algorithm", "naive", "--n", "256")
    assert result.exit_code == 0, result.output
    assert all(name in result.output for name in ("gemm_qk", "softmax", "gemm_pv", "total", "DRAM read"))


def test_measured_naive_ncu_csv_maps_and_sums_the_kernels(tmp_path):
    report = tmp_path / "naive.csv"
    report.write_text(ncu_csv(NAIVE_KERNELS))
    data = json.loads(invoke("--algorithm", "naive", "--n", "1024", "--measured", str(report), "--json").output)
    by_name = {k["kernel"]: k for k in data["kernels"]}
    qk = by_name["gemm_qk"]  # the two kernels before the softmax, summed; the marker skipped
    assert (qk["measured_dram_read_bytes"], qk["measured_dram_write_bytes"]) == (1_000_500, 2_000_700)
    assert qk["measured_time_s"] == pytest.approx(11_000e-9)
    assert by_name["softmax"]["measured_dram_read_bytes"] == 33_000_000
    assert by_name["gemm_pv"]["measured_dram_write_bytes"] == 700_000
    for k in data["kernels"]:
        assert isinstance(k["measured_dram_read_bytes"], int)
        assert k["dram_read_bytes_error"] == pytest.approx(
            (k["dram_read_bytes"] - k["measured_dram_read_bytes"]) / k["measured_dram_read_bytes"])
        assert k["time_s_error"] == pytest.approx((k["time_s"] - k["measured_time_s"]) / k["measured_time_s"])
    assert data["config"]["measured_format"] == "ncu_csv"


def test_measured_flash_ncu_csv_for_either_kernel_name(tmp_path):
    report = tmp_path / "sdpa.csv"
    report.write_text(ncu_csv([("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", 5_000_000,
                                 1_000_000, 50_000)]))
    result = invoke("--n", "1024", "--heads", "16", "--kernel", "sdpa_flash", "--measured", str(report))
    assert result.exit_code == 0, result.output
    assert "measured" in result.output and "err" in result.output
    data = json.loads(invoke("--n", "1024", "--heads", "16", "--kernel", "sdpa_flash", "--measured", str(report),
                             "--json").output)
    assert data["kernels"][0]["measured_dram_write_bytes"] == 1_000_000


def test_measured_split_kv_ncu_csv_pairs_both_kernels(tmp_path):
    """PyTorch runs a small grid split-KV: its two kernels are the prediction's split and combine rows."""
    report = tmp_path / "split.csv"
    report.write_text(ncu_csv([("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>",
                                3_200_000, 0, 32_000),
                               ("void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128>>",
                                8_470_000, 0, 7_700)]))
    data = json.loads(invoke("--n", "4096", "--kernel", "sdpa_flash", "--measured", str(report), "--json").output)
    assert [k["kernel"] for k in data["kernels"]] == ["flash_decoding_split", "flash_decoding_combine"]
    assert [k["measured_dram_read_bytes"] for k in data["kernels"]] == [3_200_000, 8_470_000]
    assert "split-KV" in data["notes"][0] and data["config"]["num_splits"] == 4
    flash = tmp_path / "flash.csv"
    flash.write_text(ncu_csv([("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", 1, 1, 1),
                              ("void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash>", 1, 1, 1)]))
    assert_refused(invoke("--n", "4096", "--kernel", "sdpa_flash", "--measured", str(flash)), "--measured",
                   "split-KV kernel and its combine")


def test_measured_calibration_json_picks_the_matching_configuration():
    recorded = json.loads(CALIBRATION.read_text())

    def entry(algorithm):
        return next(c for c in recorded["configs"] if c["config"] == {
            "algorithm": algorithm, "n": 4096, "heads": 32, "d": 128, "causal": False, "block_q": 128, "block_kv": 64})

    for kernel, algorithm in (("simflash", "fa2"), ("sdpa_flash", "sdpa_flash")):
        result = invoke("--n", "4096", "--heads", "32", "--d", "128", "--kernel", kernel,
                        "--measured", str(CALIBRATION), "--json")
        assert result.exit_code == 0, result.output
        (kernel_row,) = json.loads(result.output)["kernels"]
        (measured,) = entry(algorithm)["kernels"]
        assert kernel_row["measured_dram_read_bytes"] == measured["dram_read_bytes"]
        assert kernel_row["measured_dram_write_bytes"] == measured["dram_write_bytes"]
        assert kernel_row["measured_time_s"] == measured["time_s"]
        assert kernel_row["dram_write_bytes_error"] == relative_error(kernel_row["dram_write_bytes"],
                                                                      measured["dram_write_bytes"])


def test_measured_profile_json():
    config = predict("naive", 4096, 128, heads=1).config
    measured, kind = load_measured(PROFILE, config)
    assert kind == "profile" and set(measured) == {"gemm_qk", "softmax", "gemm_pv"}
    assert all(isinstance(v["dram_read_bytes"], int) and v["time_s"] > 0 for v in measured.values())


def assert_refused(result, option: str, *words: str) -> None:
    text = flat(result.output)
    assert result.exit_code == 2, result.output
    assert option in text and all(word in text for word in words), text
    assert "Traceback" not in result.output


def test_measured_bad_files_are_refused_naming_the_option(tmp_path):
    assert_refused(invoke("--measured", str(tmp_path / "absent.csv")), "--measured", "no such file")
    assert_refused(invoke("--measured", str(tmp_path)), "--measured", "not a file")
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("not a report\n1,2,3\n")
    assert_refused(invoke("--measured", str(garbage)), "--measured", "neither JSON nor an ncu CSV")
    other = tmp_path / "other.json"
    other.write_text('{"rows": []}')
    assert_refused(invoke("--measured", str(other)), "--measured", "not a calibration or profile")
    assert_refused(invoke("--n", "1000", "--measured", str(CALIBRATION)), "--measured", "no configuration",
                   "n=1000")
    assert_refused(invoke("--heads", "32", "--cache", "warm", "--measured", str(CALIBRATION)), "--measured",
                   "--cache cold")
    assert_refused(invoke("--kernel", "sdpa_flash", "--measured", str(PROFILE)), "--measured", "--kernel simflash")
    two = tmp_path / "two.csv"
    two.write_text(ncu_csv([("flash2_forward", 1, 1, 1), ("flash2_forward", 1, 1, 1)]))
    assert_refused(invoke("--measured", str(two)), "--measured", "one configuration")
    no_softmax = tmp_path / "fa2.csv"
    no_softmax.write_text(ncu_csv([("flash2_forward", 1, 1, 1)]))
    assert_refused(invoke("--algorithm", "naive", "--measured", str(no_softmax)), "--measured", "softmax")
    kilobytes = tmp_path / "kbytes.csv"
    kilobytes.write_text(ncu_csv([("flash2_forward", 1, 1, 1)], byte_unit="Kbyte"))
    assert_refused(invoke("--measured", str(kilobytes)), "--measured", "--print-units base")


def test_bad_options_are_refused_naming_the_option(tmp_path):
    assert_refused(invoke("--algorithm", "fa3"), "--algorithm", "naive, fa2")
    assert_refused(invoke("--kernel", "cudnn"), "--kernel", "simflash")
    assert_refused(invoke("--cache", "hot"), "--cache", "cold")
    assert_refused(invoke("--plot", str(tmp_path / "bars.pdf")), "--plot", ".png")
    assert_refused(invoke("--plot-vs-n", str(tmp_path / "curve.txt")), "--plot-vs-n", ".png")
    assert_refused(invoke("--n", "0"), "--n", "must be a positive integer")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 8_000


def test_plot_writes_the_bars(tmp_path):
    report = tmp_path / "naive.csv"
    report.write_text(ncu_csv(NAIVE_KERNELS))
    picture = tmp_path / "bars.png"
    result = invoke("--algorithm", "naive", "--n", "1024", "--measured", str(report), "--plot", str(picture))
    assert result.exit_code == 0, result.output
    assert_png(picture)
    assert "wrote" in result.output


def test_physical_bars_data():
    prediction = predict("naive", 256, 64)
    bars = plots.physical_bars(prediction, {"softmax": {"dram_read_bytes": 5, "dram_write_bytes": 7}})
    assert list(bars) == ["gemm_qk", "softmax", "gemm_pv"]
    assert bars["softmax"]["DRAM write (measured)"] == 7 and "DRAM read (measured)" not in bars["gemm_qk"]
    assert bars["gemm_pv"]["L2 hits"] == prediction.kernel("gemm_pv").l2_hit_bytes


def test_plot_vs_n_writes_the_curves(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "DRAM_VS_N_NAIVE", (256, 512))
    monkeypatch.setattr(plots, "DRAM_VS_N_FA2", (1024, 2048))
    monkeypatch.setattr(plots, "DRAM_VS_N_FA2_HEADS", (1, 2))
    picture = tmp_path / "vs_n.png"
    result = invoke("--n", "256", "--d", "64", "--plot-vs-n", str(picture), "--json")
    assert result.exit_code == 0, result.output
    assert_png(picture)
    json.loads(result.output)  # --json output stays pure JSON


def test_dram_vs_n_data():
    data = plots.dram_vs_n(naive_n=(256, 1024), fa2_n=(1024,), fa2_heads=(1, 4), d=64)
    naive, fa2 = data["naive"], data["fa2"]
    assert list(naive["n"]) == [256, 1024] and (naive["cold"] <= naive["logical"]).all()
    assert set(fa2["dram"]) == {1, 4} and fa2["logical"][4][0] == 4 * fa2["logical"][1][0]
    assert naive["l2_fit_n"] == pytest.approx((data["l2_bytes"] / 4) ** 0.5)
    assert fa2["l2_fit_n"] == pytest.approx(data["l2_bytes"] / (2 * 64 * 2))
