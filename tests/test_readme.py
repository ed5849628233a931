"""The README's commands and Python example stay true."""

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_opens_with_the_two_commands():
    first = blocks("console")[0].splitlines()
    assert README.read_text().index("```console") < README.read_text().index("\n## ")
    assert len(first) == 2
    run, test = (shlex.split(line.replace("&&", " && ")) for line in first)
    assert run[-1] == "run" and run[-2].endswith("simflash")
    assert test[-1].endswith("pytest") and "'.[test]'" in first[1]


def test_readme_python_example_runs():
    namespace: dict = {}
    for code in blocks("python"):
        exec(compile(code, str(README), "exec"), namespace)
    assert namespace["run"].traffic.total_bytes > 0


def test_readme_run_table_is_what_simflash_run_prints():
    import json

    from typer.testing import CliRunner

    from simflash.cli import app
    from simflash.config import MiB

    table = next(b for b in blocks("text") if b.startswith("configuration"))
    result = CliRunner().invoke(app, ["run", "--json"])
    assert result.exit_code == 0, result.output
    measured = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    for line in table.splitlines()[1:]:
        name, numbers = re.match(r"(.+?)\s{2,}([\d.]+\s+[\d.]+\s+[\d.]+)", line).groups()
        traffic = measured[name]["traffic"]
        expected = [f"{traffic[k] / MiB:.2f}" for k in ("read_bytes", "write_bytes", "total_bytes")]
        assert numbers.split() == expected, name


def test_readme_figures_are_the_committed_measurements():
    import json

    root = README.parent
    text = README.read_text()
    flash, naive, large, physical = json.loads((root / "benchmarks/results.json").read_text())["results"]
    assert f"| ≤ {flash['target_ratio']}x | {flash['ratio']:.2f}x ({flash['simulated_s']:.3f} s vs {flash['bare_s']:.3f} s) |" in text
    assert f"| ≤ {naive['target_ratio']}x | {naive['ratio']:.2f}x ({naive['simulated_s']:.3f} s vs {naive['bare_s']:.3f} s) |" in text
    assert f"| < {large['target_s']} s | {large['seconds']:.1f} s (the bare loop: {large['bare_s']:.1f} s) |" in text
    assert f"| < {large['target_mb']} MB | {large['peak_rss_mb']:.0f} MB (naive's S alone: {large['naive_S_would_be_mb']:.0f} MB) |" in text
    assert f"| < {physical['target_s']} s | {physical['seconds']:.1f} s |" in text
    rows = json.loads((root / "benchmarks/gpu/bench.json").read_text())["rows"]
    gpu_lines = re.findall(r"^\| (\d+) \| (\d+) \| (no|yes) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", text, flags=re.M)
    assert len(gpu_lines) == 3
    for n, d, causal, ours, sdpa, ratio in gpu_lines:
        row = next(r for r in rows if (r["config"]["n"], r["config"]["d"], r["config"]["causal"]) ==
                   (int(n), int(d), causal == "yes"))
        assert (ours, sdpa, ratio) == (f"{row['fa2']['128x64']['tflops']:.1f}", f"{row['sdpa_flash']['tflops']:.1f}",
                                       f"{row['fa2']['128x64']['tflops'] / row['sdpa_flash']['tflops']:.2f}")


def test_readme_says_beside_the_66_mib_that_fa2_always_writes_l():
    """The note beside the 66 MiB: FlashAttention-2's kernel writes L too, and how to count it; its
    figures are the closed form's."""
    import simflash as sf
    from simflash.config import KiB, MiB

    text = " ".join(README.read_text().split())
    plain = sf.model.flash_traffic(4096, 128).total_bytes
    with_l = sf.model.flash_traffic(4096, 128, write_logsumexp=True).total_bytes
    assert plain == 66 * MiB
    note = text[text.index("The 66 MiB of FA-2 leaves out the logsumexp"):]
    assert f"+{(with_l - plain) // KiB} KiB per head at N = 4096, {with_l / MiB:.2f} MiB in all" in note
    assert "write_logsumexp=True" in note and "simflash run --write-logsumexp" in note
