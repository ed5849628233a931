"""`simflash gpu sanitize` without a GPU: its plan covers every kernel source the backend ships, its
configurations are ones the kernels take, and the sanitizer's reports are read kernel by kernel (the
command end to end against a stand-in compute-sanitizer)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash.backends import sanitize, sanitize_target
from simflash.backends.decoding import split_schedule
from simflash.backends.flash2_v2 import Flash2V2Kernel
from simflash.backends.kernels import (
    DecodeCombineKernel,
    DecodeSplitKernel,
    Flash2BackwardKernels,
    Flash2Kernel,
    decode_slices,
)
from simflash.backends.sanitize import PLAN, SanitizerRun, error_records, names_kernel, summarize
from simflash.backends.sanitize_target import DONE, GROUPS, LAUNCH
from simflash.cli import app

BACKENDS = Path(sanitize.__file__).resolve().parent
H200_SHARED = sf.GPUS["H200"].max_shared_bytes_per_cta
runner = CliRunner()


def test_the_plan_names_every_kernel_source_and_its_global_function():
    assert sorted(k.source for k in PLAN) == sorted(p.name for p in BACKENDS.glob("*.cu"))
    for k in PLAN:
        text = (BACKENDS / k.source).read_text()
        kernels = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text)
        assert kernels == [k.kernel], k.source
    assert {k.group for k in PLAN} == set(GROUPS)
    assert len({k.kernel for k in PLAN}) == len(PLAN)


def test_forward_configurations_are_built_and_cover_ragged_causal_windowed_grouped_and_d_256():
    configs = sanitize_target.FORWARD_CONFIGS
    for c in configs:
        Flash2Kernel(c.dtype, c.block_q, c.block_kv, c.d)
        assert Flash2Kernel(c.dtype, c.block_q, c.block_kv, c.d).shared_bytes <= H200_SHARED
        if c.window == (-1, -1) and c.group == 1 and c.d != 256:
            Flash2V2Kernel(c.dtype, c.block_q, c.block_kv, c.d)
        q, k, v = sanitize_target.inputs(np.random.default_rng(0), c)
        run = sf.flash_attention(q, k, v, c.block_q, c.block_kv, causal=c.causal, causal_variant=c.causal_variant,
                                 dtype=c.dtype, window=c.window, pack_gqa=c.pack_gqa, trace="none")
        assert run.out.shape == q.shape
    assert any(c.n_q % c.block_q and c.n_kv % c.block_kv for c in configs)  # ragged tiles
    assert {c.causal_variant for c in configs if c.causal} == {"upper_left", "lower_right"}
    assert any(c.n_q < c.n_kv for c in configs) and any(c.n_q > c.n_kv for c in configs)
    assert any(c.window != (-1, -1) for c in configs) and any(c.pack_gqa for c in configs)
    assert any(c.group > 1 and not c.pack_gqa for c in configs) and any(c.d == 256 for c in configs)
    assert {c.dtype for c in configs} == {"float16", "bfloat16"}
    v2 = [c for c in configs if c.window == (-1, -1) and c.group == 1 and c.d != 256]
    assert len(v2) >= 3 and any(c.causal for c in v2)
    c = sanitize_target.LOGSUMEXP_CONFIG  # its first query tile sees no key
    assert c.causal_variant == "lower_right" and c.n_q - c.n_kv >= c.block_q


def test_decode_cases_are_built_and_run_split_alone_split_and_combine_and_every_slice_count():
    slices, splits = set(), set()
    for c in sanitize_target.DECODE_CASES:
        sched = split_schedule(c.batch, c.batch * c.heads, c.batch * c.kv_heads, c.n_q, c.n_kv, c.d, c.num_splits,
                               c.block_kv, c.pack_gqa, c.cache_seqlens, c.causal, c.window, sm_count=132)
        assert sched.num_splits == c.num_splits
        rows = min(sched.block_q, c.n_q * sched.pack)
        DecodeSplitKernel(c.dtype, c.d, c.block_kv, decode_slices(rows))
        DecodeCombineKernel(c.dtype, c.d)
        slices.add(decode_slices(rows))
        splits.add(c.num_splits > 1)
        rng = np.random.default_rng(1)
        q = rng.standard_normal((c.batch, c.heads, c.n_q, c.d))
        k, v = (rng.standard_normal((c.batch, c.kv_heads, c.n_kv, c.d)) for _ in range(2))
        run = sf.flash_decoding(q, k, v, c.num_splits, c.block_kv, pack_gqa=c.pack_gqa, cache_seqlens=c.cache_seqlens,
                                causal=c.causal, window=c.window, dtype=c.dtype)
        assert run.out.shape == q.shape
    assert slices == {1, 2, 4} and splits == {False, True}
    cases = sanitize_target.DECODE_CASES
    assert any(c.cache_seqlens for c in cases) and any(c.window != (-1, -1) for c in cases)
    assert any(c.pack_gqa and c.heads > c.kv_heads for c in cases) and any(not c.pack_gqa for c in cases)
    assert any(c.causal for c in cases) and {c.dtype for c in cases} == {"float16", "bfloat16"}


def test_backward_and_softmax_cases_are_built():
    for c in sanitize_target.BACKWARD_CONFIGS:
        kernels = Flash2BackwardKernels(c.dtype, c.block_q, c.block_kv, c.d)
        assert kernels.shared_bytes <= H200_SHARED
        assert (c.batch, c.kv_heads, c.window, c.pack_gqa) == (1, None, (-1, -1), False)  # what the backward takes
    configs = sanitize_target.BACKWARD_CONFIGS
    assert {c.causal_variant for c in configs if c.causal} == {"upper_left", "lower_right"}
    assert any(c.n_q > c.n_kv for c in configs) and any(c.n_q < c.n_kv for c in configs)
    assert {c.block_q for c in configs} == {64, 128} and {c.dtype for c in configs} == {"float16", "bfloat16"}
    lengths = {n_kv for _, n_kv, *_ in sanitize_target.SOFTMAX_CASES}
    assert any(n % 2 for n in lengths) and any(n % 8 == 0 for n in lengths)  # scalar and vector row paths


class Simulated:
    """The GPU wrappers' results, computed by the simulator: the target's checks and lines run on the CPU."""

    def __init__(self, run, **extra):
        self.out, self.logsumexp = run.out, run.logsumexp
        self.__dict__.update(extra)


def test_the_target_checks_each_result_and_prints_a_line_per_launch(monkeypatch, capsys):
    """Each group with the simulator standing in for the GPU wrappers (same arguments): every launch is
    checked against float64 and printed under its kernel's name; the program's last line is DONE."""
    from simflash.backends import decoding, flash2, flash2_backward

    def forward(q, k, v, block_q, block_kv, *, version, instrumented, trace_head=None, trace_tile=None, **kw):
        return Simulated(sf.flash_attention(q, k, v, block_q, block_kv, trace="none", **kw))

    def decode(q, k, v, num_splits, block_kv, *, instrumented, **kw):
        return Simulated(sf.flash_decoding(q, k, v, num_splits, block_kv, **kw))

    def backward(q, k, v, do, block_q, block_kv, *, instrumented, **kw):
        run = sf.flash_attention_backward(q, k, v, do, block_q, block_kv, **kw)
        return Simulated(run.forward, dq=run.dq, dk=run.dk, dv=run.dv)

    monkeypatch.setattr(flash2, "flash_attention", forward)
    monkeypatch.setattr(decoding, "flash_decoding", decode)
    monkeypatch.setattr(flash2_backward, "flash_attention_backward", backward)
    sanitize_target.main(["forward-v1", "forward-v2", "forward-v3", "decode", "backward"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == DONE
    kernels = [re.match(r"launched (\w+), (instrumented|timed) build, ", line).group(1) for line in lines[:-1]]
    target = sanitize_target
    v2 = [c for c in target.FORWARD_CONFIGS if c.window == (-1, -1) and c.group == 1 and c.d != 256]
    assert kernels.count("flash2_forward") == 2 * len(target.FORWARD_CONFIGS)
    assert kernels.count("flash2_forward_v2") == 2 * len(v2)
    v3 = [c for c in v2 if flash2.builds("v3", c.block_q, c.block_kv, c.d)]
    assert v3, "version 3 has no configuration to run"
    assert kernels.count("flash2_forward_v3") == 2 * 2 * len(v3)  # v3 and v3-nopp, both builds
    assert kernels.count("flash_decoding_split") == 2 * len(target.DECODE_CASES)
    assert kernels.count("flash_decoding_combine") == 2 * sum(c.num_splits > 1 for c in target.DECODE_CASES)
    for name in ("flash2_backward_preprocess", "flash2_backward", "flash2_backward_convert"):
        assert kernels.count(name) == 2 * len(target.BACKWARD_CONFIGS)

    def wrong(q, k, v, block_q, block_kv, **kw):  # a kernel that loses its last key
        return Simulated(sf.flash_attention(q, k[..., :-1, :], v[..., :-1, :], block_q, block_kv, trace="none",
                                            **{n: kw[n] for n in ("causal", "causal_variant", "dtype", "window",
                                                                  "pack_gqa")}))

    monkeypatch.setattr(flash2, "flash_attention", wrong)
    with pytest.raises(AssertionError, match=r"flash2_forward .* relative error"):
        sanitize_target.main(["forward-v1"])
    with pytest.raises(SystemExit, match="GROUP one of"):
        sanitize_target.main(["forward-v9"])


class HostArray(np.ndarray):
    """A NumPy array with CuPy's .get(), for a stand-in device."""

    def get(self):
        return np.asarray(self)


def test_the_softmax_group_reads_back_the_bits_the_kernel_writes(monkeypatch, capsys):
    """naive_softmax's launch with a stand-in device that computes P from S's bits as the kernel does."""
    from types import SimpleNamespace

    from simflash.config import STORAGE_DTYPES

    device = SimpleNamespace(asarray=lambda x: np.array(x).view(HostArray),
                             zeros_like=lambda x: np.zeros_like(x).view(HostArray),
                             zeros=lambda n, dtype: np.zeros(n, dtype).view(HostArray), uint64=np.uint64)

    class Softmax:
        def __init__(self, dtype, instrumented):
            self.dtype = STORAGE_DTYPES[dtype]

        def function(self, n_kv):
            def launch(grid, block, args, shared_mem):
                S_d, P_d, n_q, n, causal, offset, _ = args
                S = np.asarray(S_d).view(self.dtype).astype(np.float64)
                visible = np.arange(n)[None, :] <= np.arange(n_q)[:, None] + offset if causal else np.ones(S.shape, bool)
                E = np.where(visible, np.exp(S - np.where(visible, S, -np.inf).max(axis=1, keepdims=True)), 0.0)
                P_d[...] = (E / E.sum(axis=1, keepdims=True)).astype(self.dtype).view(np.uint16)
            return launch

    monkeypatch.setattr(sanitize_target, "import_cupy", lambda: device)
    monkeypatch.setattr(sanitize_target, "SoftmaxKernel", Softmax)
    sanitize_target.main(["naive-softmax"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == DONE and len(lines) == 1 + 2 * len(sanitize_target.SOFTMAX_CASES)
    assert all(line.startswith("launched naive_softmax, ") for line in lines[:-1])


def launched(kernel: str) -> str:
    return LAUNCH.format(kernel=kernel, build="timed", label="float16 n_q=3", check="relative error 1e-4")


def report(group: str, records: str = "", tool: str = "memcheck") -> str:
    """A sanitizer's report over one group: banner, the target's launch lines, records, its end, summary."""
    lines = ["========= COMPUTE-SANITIZER"] + [launched(k.kernel) for k in PLAN if k.group == group]
    summary = ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" if tool == "racecheck"
               else "========= ERROR SUMMARY: 0 errors")
    if records:
        count = len(error_records(records))
        summary = (f"========= RACECHECK SUMMARY: {count} hazards displayed ({count} errors, 0 warnings)"
                   if tool == "racecheck" else f"========= ERROR SUMMARY: {count} errors")
    return "\n".join([*lines, records, DONE, summary]) + "\n"


MEMCHECK_RECORD = """========= Invalid __global__ read of size 16 bytes
=========     at void flash_decoding_combine<(int)0, (int)128, (bool)1>(const float *, const float *, unsigned short *, int, int, unsigned long long *)+0x1a0
=========     by thread (3,0,0) in block (17,0,0)
=========     Address 0x7f00 is out of bounds
========="""
RACECHECK_RECORD = """========= Error: Race reported between Write access at _Z15flash2_backwardILi0ELi64ELi128ELi64ELb1EEvPKtS1_+0x9f0
=========     and Read access at _Z15flash2_backwardILi0ELi64ELi128ELi64ELb1EEvPKtS1_+0xa40 [64 hazards]
========="""


def by_kernel(summary: list[dict], tool: str) -> dict[str, dict]:
    return {e["kernel"]: e for e in summary if e["tool"] == tool}


def test_records_are_read_kernel_by_kernel():
    assert names_kernel("at void flash2_backward<(int)0>(...)", "flash2_backward")
    assert not names_kernel("at void flash2_backward_convert<(int)0>(...)", "flash2_backward")
    assert names_kernel("_Z26flash2_backward_preprocessILi0E", "flash2_backward_preprocess")
    assert not names_kernel("_Z26flash2_backward_preprocessILi0E", "flash2_backward")
    assert not names_kernel("flash2_forward_v2<0, 64>", "flash2_forward")
    assert len(error_records(report("decode", MEMCHECK_RECORD))) == 1 and not error_records(report("decode"))

    runs = [SanitizerRun("memcheck", group, "", 0, report(group)) for group in GROUPS]
    runs[list(GROUPS).index("decode")] = SanitizerRun("memcheck", "decode", "", 1, report("decode", MEMCHECK_RECORD))
    runs += [SanitizerRun("racecheck", group, "", 0, report(group, tool="racecheck")) for group in GROUPS]
    runs[len(GROUPS) + list(GROUPS).index("backward")] = SanitizerRun(
        "racecheck", "backward", "", 1, report("backward", RACECHECK_RECORD, "racecheck"))
    summary = summarize(runs, ["memcheck", "racecheck"])
    assert len(summary) == 2 * len(PLAN)
    memcheck, racecheck = by_kernel(summary, "memcheck"), by_kernel(summary, "racecheck")
    assert memcheck["flash_decoding_combine"]["problems"] == ["1 error record(s) name it"]
    assert memcheck["flash_decoding_split"]["clean"] and memcheck["flash_decoding_split"]["launches"] == 1
    assert racecheck["flash2_backward"]["problems"] == ["1 error record(s) name it"]
    assert racecheck["flash2_backward_preprocess"]["clean"] and racecheck["flash2_backward_convert"]["clean"]
    assert [k for k, e in {**memcheck}.items() if not e["clean"]] == ["flash_decoding_combine"]
    assert [k for k, e in racecheck.items() if not e["clean"]] == ["flash2_backward"]


@pytest.mark.parametrize(("run", "problem"), [
    (SanitizerRun("memcheck", "backward", "", None, report("backward")[:40]), "the run hit its time limit"),
    (SanitizerRun("memcheck", "backward", "", 1, report("backward").replace(DONE, "AssertionError: dq")),
     "the target stopped before its end (exit 1)"),
    (SanitizerRun("memcheck", "backward", "", 1, report("backward", "========= Program hit cudaErrorLaunchFailure\n"
                                                                    "=========     Saved host backtrace\n=========")),
     "1 error record(s) name no kernel"),
    (SanitizerRun("memcheck", "backward", "", 0, report("backward").replace("ERROR SUMMARY: 0 errors", "")),
     "exit 0 with no clean summary and no error record"),
])
def test_a_run_that_failed_otherwise_counts_against_every_kernel_of_its_group(run, problem):
    summary = by_kernel(summarize([run], ["memcheck"]), "memcheck")
    for k in PLAN:
        if k.group == "backward":
            assert problem in summary[k.kernel]["problems"], k.kernel
        else:
            assert summary[k.kernel]["problems"] == [f"its group {k.group} did not run"]


def test_a_kernel_its_group_never_launched_is_not_clean():
    output = report("decode").replace(launched("flash_decoding_combine") + "\n", "")
    summary = by_kernel(summarize([SanitizerRun("memcheck", "decode", "", 0, output)], ["memcheck"]), "memcheck")
    assert summary["flash_decoding_combine"]["problems"] == ["never launched"]
    assert summary["flash_decoding_split"]["clean"]


STAND_IN = """#!{python}
# compute-sanitizer stand-in: prints the report of SPEC[tool][group] (records, exit code, or a sleep).
import json, sys, time
spec = json.load(open({spec!r}))
if sys.argv[1] == "--version":
    print("NVIDIA (R) Compute Sanitizer\\nVersion 2099.1.0")
    sys.exit(0)
tool, group = sys.argv[2], sys.argv[-1]
case = spec.get(tool, {{}}).get(group, {{}})
time.sleep(case.get("sleep", 0))
print(case.get("report") or spec["clean"][tool][group], end="")
sys.exit(case.get("exit", 0))
"""


def stand_in(tmp_path: Path, monkeypatch, spec: dict) -> None:
    spec["clean"] = {tool: {group: report(group, tool=tool) for group in GROUPS} for tool in ("memcheck", "racecheck")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text(STAND_IN.format(python=sys.executable, spec=str(tmp_path / "spec.json")))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tool.parent))


def test_cli_one_line_per_kernel_and_tool_exit_1_and_the_saved_record(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, {"memcheck": {"decode": {"report": report("decode", MEMCHECK_RECORD), "exit": 1}},
                                     "racecheck": {"naive-softmax": {"sleep": 30}}})
    save = tmp_path / "sanitizer.json"
    result = runner.invoke(app, ["gpu", "sanitize", "--save", str(save), "--timeout", "2"])
    assert result.exit_code == 1, result.output
    lines = {tuple(line.split()[:2]): line for line in result.output.splitlines() if line.startswith(("memcheck ", "racecheck "))}
    assert len(lines) == 2 * len(PLAN)
    assert "NOT CLEAN: 1 error record(s) name it" in lines["memcheck", "flash_decoding_combine"]
    assert "NOT CLEAN: the run hit its time limit" in lines["racecheck", "naive_softmax"]
    assert "clean (1 launches)" in lines["memcheck", "flash_decoding_split"]
    assert sum("NOT CLEAN" in line for line in lines.values()) == 2
    assert f"Version 2099.1.0: 2 of {2 * len(PLAN)} (tool, kernel) pairs NOT CLEAN" in result.output
    record = json.loads(save.read_text())
    assert record["complete"] is True and record["all_clean"] is False and record["tools"] == ["memcheck", "racecheck"]
    assert record["command"].startswith("simflash ") and len(record["runs"]) == 2 * len(GROUPS)
    assert {(r["tool"], r["group"]) for r in record["runs"] if not r["clean"]} == {("memcheck", "decode"),
                                                                                  ("racecheck", "naive-softmax")}
    assert all(r["command"].startswith(f"compute-sanitizer --tool {r['tool']} --error-exitcode 1 python -m ")
               for r in record["runs"])


def test_cli_all_clean_exits_0(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, {})
    result = runner.invoke(app, ["gpu", "sanitize", "--tool", "racecheck"])
    assert result.exit_code == 0, result.output
    assert result.output.count("racecheck ") == len(PLAN) + len(GROUPS)  # the runs' lines and the summary's
    assert result.output.rstrip().endswith("Version 2099.1.0: all clean")


def test_cli_bad_input_and_a_missing_sanitizer(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, {})
    bad = runner.invoke(app, ["gpu", "sanitize", "--tool", "memcheck,leakcheck"])
    assert bad.exit_code == 2 and "--tool" in bad.output and "leakcheck" in bad.output
    bad = runner.invoke(app, ["gpu", "sanitize", "--timeout", "0"])
    assert bad.exit_code == 2 and "--timeout" in bad.output
    bad = runner.invoke(app, ["gpu", "sanitize", "--save", str(tmp_path / "no" / "such" / "dir.json")])
    assert bad.exit_code == 2 and "--save" in bad.output
    monkeypatch.setenv("PATH", str(tmp_path))
    missing = runner.invoke(app, ["gpu", "sanitize"])
    assert missing.exit_code == 1 and "compute-sanitizer is not on PATH" in missing.output
