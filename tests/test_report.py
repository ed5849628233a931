"""Latency attribution: the document-QA scenario's worked values, the seven sections, scenario validation."""

import copy
import importlib.resources

import pytest
import yaml
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app
from simflash.model.report import attribute, builtin_scenarios, load_scenario, parse_scenario, render_report

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
SECTIONS = ("1. Workload & Target", "2. Trace Timings", "3. Observation & Hypotheses", "4. Proposed Change",
            "5. Projected Impact", "6. Boundary Errors to Avoid", "7. Next Measurement Plan")


@pytest.fixture
def qa_data():
    """The built-in scenario as nested dicts, to be edited per test."""
    text = (importlib.resources.files("simflash.model") / "scenarios" / "document_qa.toml").read_text()
    return tomllib.loads(text)


def test_document_qa_worked_values():
    a = attribute(load_scenario("document_qa"))
    assert f"{a.ttft_ms:.1f}" == "380.0"
    assert [f"{share:.1%}" for share in a.segment_shares] == ["3.9%", "17.1%", "76.3%", "2.6%"]
    assert (f"{a.attention_ms:.1f}", f"{a.other_ms:.1f}") == ("116.0", "174.0")
    assert f"{a.segment_projection.speedup:.4f}" == "1.3636"
    assert f"{a.segment_projected_ms:.2f}" == "212.67"
    assert f"{a.segment_projection.latency_reduction:.2%}" == "26.67%"
    assert f"{a.ttft_projected_ms:.2f}" == "302.67"
    assert f"{a.client_projection.speedup:.4f}" == "1.2555"
    assert f"{a.client_projection.latency_reduction:.2%}" == "20.35%"
    assert f"{a.kernel_applied_to_ttft_ms:.1f}" == "126.7"
    assert round(a.flop_share.share * 100) == 6  # the lesson's "~6% of FLOPs at P = 4,096"


def test_both_boundaries_agree_with_amdahl():
    a = attribute(load_scenario("document_qa"))
    assert a.segment_projected_ms == pytest.approx(a.segment_ms / a.segment_projection.speedup)
    assert a.ttft_projected_ms == pytest.approx(a.ttft_ms / a.client_projection.speedup)
    assert a.client_projection.speedup == pytest.approx(sf.amdahl(116.0 / 380.0, 3.0))


def test_report_has_the_seven_sections_in_order_on_one_page():
    text = render_report(load_scenario("document_qa"))
    positions = [text.index(f"## {section}") for section in SECTIONS]
    assert positions == sorted(positions)
    for value in ("380.0 ms", "212.67 ms", "302.67 ms", "1.3636x", "1.2555x", "20.35%", "126.7 ms", "76.3%",
                  "(26.67% reduction)", "exceeds the 350.0 ms target", "within the 40.0 ms budget"):
        assert value in text
    assert len(text.splitlines()) <= 70


def test_report_reflects_its_scenario(qa_data):
    qa_data["proposal"]["kernel_speedup"] = 1.1
    qa_data["trace"]["decode_tpot_ms"] = 50.0
    text = render_report(parse_scenario(qa_data))
    assert "would still exceed the 350.0 ms target" in text
    assert "decode TPOT (50.0 ms) exceeds the 40.0 ms budget" in text
    assert f"{290 * 0.6 + 116 / 1.1:.2f} ms" in text


def test_yaml_scenario_equals_toml(qa_data, tmp_path):
    path = tmp_path / "qa.yaml"
    path.write_text(yaml.safe_dump(qa_data))
    assert load_scenario(path) == load_scenario("document_qa")
    assert "document_qa" in builtin_scenarios()


def _edit(data, path, value):
    """Set (or with value=None, delete) the field at a dotted path like 'trace.segments.1.ms'."""
    *parents, last = path.split(".")
    for key in parents:
        data = data[int(key)] if key.isdigit() else data[key]
    if value is None:
        del data[last]
    else:
        data[last] = value


@pytest.mark.parametrize(("path", "value", "named"), [
    ("proposal.attention_share", 1.2, "proposal.attention_share"),
    ("proposal.attention_share", -0.1, "proposal.attention_share"),
    ("trace.segments.1.ms", -65.0, "trace.segments[1].ms"),
    ("trace.decode_tpot_ms", 0, "trace.decode_tpot_ms"),
    ("proposal.kernel_speedup", True, "proposal.kernel_speedup"),
    ("workload.prompt_tokens", 4096.5, "workload.prompt_tokens"),
    ("targets.ttft_p95_ms", None, "targets.ttft_p95_ms"),
    ("proposal", None, "proposal"),
    ("trace.segments.0.name", None, "trace.segments[0].name"),
    ("proposal.segment", "GPU decode", "proposal.segment"),
    ("proposal.atention_share", 0.4, "proposal.atention_share"),
    ("model.dtype", "float8", "model.dtype"),
    ("proposal.variant", "fa9", "proposal.variant"),
    ("trace.segments", [], "trace.segments"),
    ("workload", "C=8", "workload"),
])
def test_invalid_scenarios_name_the_field(qa_data, path, value, named):
    data = copy.deepcopy(qa_data)
    _edit(data, path, value)
    with pytest.raises(ValueError, match=f"'{named}'".replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(data)


def test_bad_sources(tmp_path):
    with pytest.raises(ValueError, match="built-in name"):
        load_scenario("qa.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_scenario(tmp_path / "missing.toml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_scenario(broken)
    duplicate = tmp_path / "dup.toml"
    duplicate.write_text("title = 'a'\ntitle = 'b'\n")
    with pytest.raises(ValueError):
        load_scenario(duplicate)


def test_cli_report(tmp_path, qa_data):
    printed = runner.invoke(app, ["report", "document_qa"], env=WIDE)
    assert printed.exit_code == 0, printed.output
    assert "302.67 ms" in printed.output and "## 7. Next Measurement Plan" in printed.output
    out = tmp_path / "report.md"
    written = runner.invoke(app, ["report", "document_qa", "--output", str(out)], env=WIDE)
    assert written.exit_code == 0 and out.read_text() == printed.output

    qa_data["proposal"]["attention_share"] = 1.4
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(qa_data))
    refused = runner.invoke(app, ["report", str(bad)], env=WIDE)
    assert refused.exit_code == 2 and "proposal.attention_share" in refused.output


def test_yaml_exponent_pitfall_gets_a_hint(qa_data, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(qa_data).replace("8000000000.0", "8.0e9"))
    with pytest.raises(ValueError, match=r"'model.params'.*8\.0e\+9"):
        load_scenario(path)
