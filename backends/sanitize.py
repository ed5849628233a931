"""compute-sanitizer over every kernel the GPU backend ships, read kernel by kernel.

PLAN names each kernel source (backends/*.cu; a test holds it to the files there, so a new kernel
cannot be left out), its __global__ function and the group of launches that runs it
(sanitize_target.GROUPS). `sanitize` runs one sanitizer process per (tool, group):

    compute-sanitizer --tool TOOL --error-exitcode 1 python -m simflash.backends.sanitize_target GROUP

each under a time limit, and `summarize` reads their reports into one line per (tool, kernel): clean,
or why not. An error record (a line of the sanitizer's report and the indented lines under it) is
the kernel's whose name it carries; a run that failed otherwise (a record naming no kernel, a result
check that failed, a crash, the time limit) counts against every kernel of its group; and a kernel
the target never launched is not clean either.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence

import attrs

from simflash.backends.sanitize_target import DONE, GROUPS

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
TARGET = "simflash.backends.sanitize_target"
PREFIX = "========= "
# The lines of a report that are no error record: the banner, the summaries, the target's own exit status.
NOT_RECORDS = re.compile(r"COMPUTE-SANITIZER|ERROR SUMMARY:|RACECHECK SUMMARY:|Target application returned an error")
CLEAN = re.compile(r"ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)")
LAUNCHED = re.compile(r"^launched (\w+), ", re.MULTILINE)


@attrs.frozen
class KernelSource:
    source: str  # file under backends/
    kernel: str  # the __global__ function it defines
    group: str  # sanitize_target.GROUPS: the launches that run it


PLAN = (
    KernelSource("flash2_forward.cu", "flash2_forward", "forward-v1"),
    KernelSource("flash2_forward_v2.cu", "flash2_forward_v2", "forward-v2"),
    KernelSource("flash2_forward_v3.cu", "flash2_forward_v3", "forward-v3"),
    KernelSource("flash_decoding_split.cu", "flash_decoding_split", "decode"),
    KernelSource("flash_decoding_combine.cu", "flash_decoding_combine", "decode"),
    KernelSource("flash2_backward_preprocess.cu", "flash2_backward_preprocess", "backward"),
    KernelSource("flash2_backward.cu", "flash2_backward", "backward"),
    KernelSource("flash2_backward_convert.cu", "flash2_backward_convert", "backward"),
    KernelSource("naive_softmax.cu", "naive_softmax", "naive-softmax"),
)


def names_kernel(text: str, kernel: str) -> bool:
    """Whether `text` names `kernel`, demangled (flash2_backward<...>) or mangled (_Z15flash2_backwardI...),
    and not as the start of a longer name (flash2_backward_convert)."""
    return re.search(rf"(?<![A-Za-z0-9_]){kernel}(?![A-Za-z0-9_])|{len(kernel)}{kernel}(?![a-z0-9_])", text) is not None


def error_records(output: str) -> list[str]:
    """The error records of a sanitizer's report, each its first line and the indented lines under it."""
    records: list[str] = []
    inside = False
    for line in output.splitlines():
        if not line.startswith(PREFIX.rstrip()):
            inside = False  # the target's own output
            continue
        text = line[len(PREFIX):] if line.startswith(PREFIX) else ""
        if text and not text.startswith(" ") and not NOT_RECORDS.search(text):
            records.append(text)
            inside = True
        elif text.startswith(" ") and inside:
            records[-1] += "\n" + text
        else:
            inside = False
    return records


@attrs.frozen
class SanitizerRun:
    """One sanitizer process: a tool over one group's launches."""

    tool: str
    group: str
    command: str
    exit_code: int | None  # None: killed at the time limit
    output: str

    @property
    def clean(self) -> bool:
        """Exit 0, a clean summary, the target's last line, and no record at all (a racecheck warning too)."""
        return (self.exit_code == 0 and CLEAN.search(self.output) is not None and DONE in self.output
                and not error_records(self.output))

    @property
    def failure(self) -> str:
        """Why the run is not clean beyond the records that name a kernel ("" when there is nothing else)."""
        if self.clean:
            return ""
        if self.exit_code is None:
            return "the run hit its time limit"
        if DONE not in self.output:
            return f"the target stopped before its end (exit {self.exit_code})"
        records = error_records(self.output)
        stray = [r for r in records if not any(names_kernel(r, k.kernel) for k in PLAN)]
        if stray:
            return f"{len(stray)} error record(s) name no kernel"
        if not records:
            return f"exit {self.exit_code} with no clean summary and no error record"
        return ""

    def to_dict(self) -> dict:
        return {"tool": self.tool, "group": self.group, "command": self.command, "exit_code": self.exit_code,
                "clean": self.clean, "output": self.output}


def summarize(runs: Sequence[SanitizerRun], tools: Sequence[str]) -> list[dict]:
    """One entry per (tool, kernel of PLAN): launches seen, error records naming it, and `clean`."""
    summary = []
    for tool in tools:
        of_tool = [r for r in runs if r.tool == tool]
        for k in PLAN:
            launches = sum(LAUNCHED.findall(r.output).count(k.kernel) for r in of_tool)
            errors = sum(names_kernel(record, k.kernel) for r in of_tool if not r.clean
                         for record in error_records(r.output))
            problems = [f"{errors} error record(s) name it"] if errors else []
            problems += [r.failure for r in of_tool if r.group == k.group and r.failure]
            if not any(r.group == k.group for r in of_tool):
                problems.append(f"its group {k.group} did not run")
            elif not launches:
                problems.append("never launched")
            summary.append({"tool": tool, "kernel": k.kernel, "source": k.source, "group": k.group,
                            "launches": launches, "errors": errors, "problems": problems, "clean": not problems})
    return summary


def summary_line(entry: dict) -> str:
    verdict = (f"clean ({entry['launches']} launches)" if entry["clean"]
               else "NOT CLEAN: " + "; ".join(entry["problems"]))
    return f"{entry['tool']:<10} {entry['kernel']:<27} {entry['source']:<30} {verdict}"


def check_tools(tools: Sequence[str]) -> list[str]:
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        raise ValueError(f"tool must be comma-separated names from {list(TOOLS)}, got {','.join(tools)!r}")
    return list(dict.fromkeys(tools))


def sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    if found is None:
        raise RuntimeError("compute-sanitizer is not on PATH; it ships with the CUDA toolkit")
    return found


def sanitizer_version() -> str:
    done = subprocess.run([sanitizer(), "--version"], capture_output=True, text=True, timeout=60, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[-1] if lines else ""


def run(tool: str, group: str, timeout_s: float) -> SanitizerRun:
    """`compute-sanitizer --tool tool` over the group's launches; killed, with its children, at timeout_s."""
    command = [sanitizer(), "--tool", tool, "--error-exitcode", "1", sys.executable, "-m", TARGET, group]
    shown = f"compute-sanitizer --tool {tool} --error-exitcode 1 python -m {TARGET} {group}"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
            exit_code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the sanitizer and the target under it
            output, _ = process.communicate()
            exit_code = None
    return SanitizerRun(tool, group, shown, exit_code, output)


def result(runs: Sequence[SanitizerRun], tools: Sequence[str], timeout_s: float, version: str) -> dict:
    """The record of the runs so far: the summary over PLAN (a group not run yet is not clean) and the outputs."""
    summary = summarize(runs, tools)
    return {"sanitizer": version, "tools": list(tools), "timeout_s": timeout_s, "kernels": summary,
            "all_clean": all(entry["clean"] for entry in summary), "runs": [r.to_dict() for r in runs]}


def sanitize(tools: Sequence[str], timeout_s: float, after_each=None) -> dict:
    """Every tool over every group of PLAN, one process each; after_each(record so far, latest run) is
    called after every run, so a record survives a run that never returns."""
    tools = check_tools(tools)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    version = sanitizer_version()
    runs: list[SanitizerRun] = []
    for tool in tools:
        for group in GROUPS:
            runs.append(run(tool, group, timeout_s))
            if after_each is not None:
                after_each(result(runs, tools, timeout_s, version), runs[-1])
    return result(runs, tools, timeout_s, version)
