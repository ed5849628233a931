"""Latency attribution: a serial trace, a proposed kernel speedup, and a one-page Markdown report.

A scenario (TOML or YAML) states the workload, the service targets, the serial segments of one
request's time to first token, and the proposal: which segment holds the attention time, its share
of that segment, and the assumed kernel speedup. Amdahl's law is applied at two boundaries, the
segment and the client's TTFT, and every figure in the report is computed from the scenario.
"""

from __future__ import annotations

import importlib.resources
import math
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import yaml

from simflash.config import MiB, storage_dtype
from simflash.model.amdahl import FlopShare, Projection, amdahl, attention_flop_share, project
from simflash.model.traffic import FLASH_TRAFFIC, flash_traffic, naive_traffic

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def _yaml_loads(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"not valid YAML: {error}") from None


# Parsers by file suffix; each raises ValueError on malformed text (tomllib's TOMLDecodeError is one).
SCENARIO_PARSERS: dict[str, Callable[[str], Any]] = {".toml": tomllib.loads, ".yaml": _yaml_loads, ".yml": _yaml_loads}


@attrs.frozen
class ModelShape:
    name: str
    params: float
    layers: int
    heads: int
    head_dim: int
    dtype: str
    notes: str


@attrs.frozen
class Workload:
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    mode: str


@attrs.frozen
class Targets:
    ttft_p95_ms: float
    decode_tokens_per_s: float

    @property
    def tpot_budget_ms(self) -> float:
        return 1000.0 / self.decode_tokens_per_s


@attrs.frozen
class Segment:
    """One serial segment of the time to first token."""

    name: str
    ms: float
    source: str
    note: str


@attrs.frozen
class Proposal:
    change: str
    segment: str  # the segment that holds the attention time
    attention_share: float  # of that segment's time
    kernel_speedup: float
    causal: bool
    variant: str


@attrs.frozen
class Scenario:
    title: str
    model: ModelShape
    workload: Workload
    targets: Targets
    segments: tuple[Segment, ...]
    decode_tpot_ms: float
    proposal: Proposal


@attrs.define
class _Table:
    """Reads one table of a parsed scenario; every error names the field by its dotted path."""

    data: Mapping[str, Any]
    path: str
    _seen: set[str] = attrs.field(factory=set)

    @classmethod
    def of(cls, value: Any, path: str) -> _Table:
        if not isinstance(value, Mapping):
            raise ValueError(f"scenario field {path!r} must be a table, got {type(value).__name__}")
        return cls(value, path)

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def raw(self, key: str, default: Any = None, required: bool = True) -> Any:
        self._seen.add(key)
        if key not in self.data:
            if required:
                raise ValueError(f"scenario is missing the field {self.field(key)!r}")
            return default
        return self.data[key]

    def text(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, default, required=default is None)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"scenario field {self.field(key)!r} must be a non-empty string, got {value!r}")
        return value

    def number(self, key: str, *, minimum: float = 0.0, above: bool = False, maximum: float = math.inf) -> float:
        """A finite number >= minimum (> minimum with above=True) and <= maximum."""
        value = self.raw(key)
        bound = f"> {minimum:g}" if above else f">= {minimum:g}"
        if maximum < math.inf:
            bound += f" and <= {maximum:g}"
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value < minimum or (above and value == minimum) or value > maximum):
            hint = " (YAML reads exponents without a sign as text: write 8.0e+9)" if _numeric_text(value) else ""
            raise ValueError(f"scenario field {self.field(key)!r} must be a number {bound}, got {value!r}{hint}")
        return float(value)

    def count(self, key: str) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"scenario field {self.field(key)!r} must be a positive integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default, required=False)
        if not isinstance(value, bool):
            raise ValueError(f"scenario field {self.field(key)!r} must be true or false, got {value!r}")
        return value

    def done(self) -> None:
        """Refuse fields nobody read: a misspelt field must not be silently ignored."""
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            raise ValueError(f"scenario field {self.field(unknown[0])!r} is not a known field "
                             f"(known here: {', '.join(sorted(self._seen))})")


def _numeric_text(value: Any) -> bool:
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


def parse_scenario(data: Any) -> Scenario:
    """Check a parsed scenario (nested dicts, as TOML or YAML give them) and build a Scenario."""
    top = _Table.of(data, "")
    title = top.text("title", "Latency attribution report")

    m = _Table.of(top.raw("model"), "model")
    dtype = m.text("dtype")
    try:
        storage_dtype(dtype)
    except ValueError as error:
        raise ValueError(f"scenario field 'model.dtype': {error}") from None
    model = ModelShape(m.text("name", "model"), m.number("params", above=True), m.count("layers"),
                       m.count("heads"), m.count("head_dim"), dtype, m.text("notes", "-"))
    m.done()

    w = _Table.of(top.raw("workload"), "workload")
    workload = Workload(w.count("concurrency"), w.count("prompt_tokens"), w.count("output_tokens"),
                        w.text("mode", "closed-loop"))
    w.done()

    t = _Table.of(top.raw("targets"), "targets")
    targets = Targets(t.number("ttft_p95_ms", above=True), t.number("decode_tokens_per_s", above=True))
    t.done()

    tr = _Table.of(top.raw("trace"), "trace")
    decode_tpot_ms = tr.number("decode_tpot_ms", above=True)
    raw_segments = tr.raw("segments")
    if not isinstance(raw_segments, list) or not raw_segments:
        raise ValueError(f"scenario field 'trace.segments' must be a non-empty list of tables, got {raw_segments!r}")
    segments = []
    for k, raw in enumerate(raw_segments):
        s = _Table.of(raw, f"trace.segments[{k}]")
        segments.append(Segment(s.text("name"), s.number("ms"), s.text("source", "-"), s.text("note", "-")))
        s.done()
    tr.done()
    names = [segment.name for segment in segments]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario field 'trace.segments' must have distinct names, got {names}")
    if sum(segment.ms for segment in segments) <= 0:
        raise ValueError("scenario field 'trace.segments' must add up to a positive time to first token")

    p = _Table.of(top.raw("proposal"), "proposal")
    proposal = Proposal(p.text("change"), p.text("segment"), p.number("attention_share", maximum=1.0),
                        p.number("kernel_speedup", above=True), p.flag("causal", True), p.text("variant", "fa2"))
    p.done()
    if proposal.segment not in names:
        raise ValueError(f"scenario field 'proposal.segment' must name one of the segments {names}, "
                         f"got {proposal.segment!r}")
    if proposal.variant not in FLASH_TRAFFIC:
        raise ValueError(f"scenario field 'proposal.variant' must be one of {sorted(FLASH_TRAFFIC)}, "
                         f"got {proposal.variant!r}")
    top.done()
    return Scenario(title, model, workload, targets, tuple(segments), decode_tpot_ms, proposal)


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with simflash."""
    folder = importlib.resources.files("simflash.model") / "scenarios"
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def load_scenario(source: str | pathlib.Path) -> Scenario:
    """A scenario from a .toml/.yaml/.yml file, or a built-in one by name (see builtin_scenarios())."""
    if str(source) in builtin_scenarios():
        resource = importlib.resources.files("simflash.model") / "scenarios" / f"{source}.toml"
        return parse_scenario(tomllib.loads(resource.read_text(encoding="utf-8")))
    path = pathlib.Path(source)
    parser = SCENARIO_PARSERS.get(path.suffix.lower())
    if parser is None:
        raise ValueError(f"scenario must be a built-in name {builtin_scenarios()} or a file ending in "
                         f"{sorted(SCENARIO_PARSERS)}, got {str(source)!r}")
    if not path.is_file():
        raise ValueError(f"scenario file {str(path)!r} does not exist")
    try:
        data = parser(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"scenario file {str(path)!r}: {error}") from None
    return parse_scenario(data)

@attrs.frozen
class Attribution:
    """The numbers behind the report: shares of TTFT and the projection at both boundaries."""

    scenario: Scenario
    ttft_ms: float
    segment_shares: tuple[float, ...]  # of TTFT, in segment order
    segment_ms: float  # the proposal's segment
    attention_ms: float
    other_ms: float  # the rest of the proposal's segment
    segment_projection: Projection  # Amdahl within the segment
    segment_projected_ms: float
    client_projection: Projection  # Amdahl on the attention share of TTFT
    ttft_projected_ms: float
    kernel_applied_to_ttft_ms: float  # the boundary error: TTFT / S_kernel
    flop_share: FlopShare
    baseline_bytes: int  # one head's attention, naive three-kernel baseline
    flash_bytes: int  # the same head, tiled


def attribute(scenario: Scenario) -> Attribution:
    proposal, model, workload = scenario.proposal, scenario.model, scenario.workload
    ttft_ms = sum(segment.ms for segment in scenario.segments)
    segment_ms = next(segment.ms for segment in scenario.segments if segment.name == proposal.segment)
    attention_ms = proposal.attention_share * segment_ms
    other_ms = segment_ms - attention_ms
    s = proposal.kernel_speedup
    segment_projected_ms = other_ms + attention_ms / s
    n, d = workload.prompt_tokens, model.head_dim
    try:
        flash_bytes = flash_traffic(n, d, dtype=model.dtype, causal=proposal.causal,
                                    variant=proposal.variant).total_bytes
    except ValueError as error:  # too many query tiles to sum: name the field that asked for them
        raise ValueError(f"scenario field 'workload.prompt_tokens' is too large for the traffic model: {error}") from None
    return Attribution(
        scenario=scenario,
        ttft_ms=ttft_ms,
        segment_shares=tuple(segment.ms / ttft_ms for segment in scenario.segments),
        segment_ms=segment_ms,
        attention_ms=attention_ms,
        other_ms=other_ms,
        segment_projection=project(proposal.attention_share, s),
        segment_projected_ms=segment_projected_ms,
        client_projection=project(attention_ms / ttft_ms, s),
        ttft_projected_ms=ttft_ms - segment_ms + segment_projected_ms,
        kernel_applied_to_ttft_ms=ttft_ms / s,
        flop_share=attention_flop_share(n, model.params, model.layers, model.heads, d, proposal.causal),
        baseline_bytes=naive_traffic(n, d, model.dtype, causal=proposal.causal).total_bytes,
        flash_bytes=flash_bytes,
    )


def render_report(scenario: Scenario) -> str:
    """The one-page Markdown report, in the seven sections of the exit task."""
    a = attribute(scenario)
    sc, p, m, w, t = scenario, scenario.proposal, scenario.model, scenario.workload, scenario.targets
    s = p.kernel_speedup
    seg = a.segment_projection
    client = a.client_projection
    masking = "causal" if p.causal else "unmasked"
    k_prop = next(k for k, segment in enumerate(sc.segments) if segment.name == p.segment)
    largest = max(range(len(sc.segments)), key=lambda k: sc.segments[k].ms)
    ttft_verdict = "exceeds" if a.ttft_ms > t.ttft_p95_ms else "is within"
    tpot_verdict = "is within" if sc.decode_tpot_ms <= t.tpot_budget_ms else "exceeds"
    projected_verdict = "would be within" if a.ttft_projected_ms <= t.ttft_p95_ms else "would still exceed"
    flop_projection = amdahl(a.flop_share.share, s)
    others = [segment for segment in sc.segments if segment.name != p.segment]
    held = " + ".join([*(f"{segment.ms:.1f}" for segment in sc.segments[:k_prop]), f"{a.segment_projected_ms:.2f}",
                       *(f"{segment.ms:.1f}" for segment in sc.segments[k_prop + 1:])])

    rows = []
    for k, (segment, share) in enumerate(zip(sc.segments, a.segment_shares), start=1):
        note = segment.note
        if segment.name == p.segment:
            note = (f"{note}; {p.attention_share:.0%} attention ({a.attention_ms:.1f} ms), "
                    f"{1 - p.attention_share:.0%} other ({a.other_ms:.1f} ms)")
        rows.append(f"| {k}. {segment.name} | {segment.source} | {segment.ms:.1f} ms | {share:.1%} | {note} |")

    lines = [
        f"# {sc.title}",
        "",
        "One trace, a strictly serial critical path: client TTFT is the sum of the segments below. "
        "Timings come from the scenario; every derived figure is computed.",
        "",
        "## 1. Workload & Target",
        "",
        f"- Model: {m.name}, {m.layers} layers, {m.heads} heads x d = {m.head_dim}, {m.dtype}, "
        f"{m.params / 1e9:g}B parameters ({m.notes}).",
        f"- Workload: C = {w.concurrency} {w.mode}, P = {w.prompt_tokens:,} prompt tokens, "
        f"O = {w.output_tokens:,} output tokens.",
        f"- Objectives: p95 TTFT <= {t.ttft_p95_ms:.1f} ms; decode >= {t.decode_tokens_per_s:.1f} tokens/s "
        f"(TPOT <= {t.tpot_budget_ms:.1f} ms).",
        "",
        "## 2. Trace Timings",
        "",
        "| Serial segment | Measurement source | Duration | Share of TTFT | Notes |",
        "|---|---|---:|---:|---|",
        *rows,
        f"| Total client TTFT (this trace) | sum of the serial segments | {a.ttft_ms:.1f} ms | "
        f"{sum(a.segment_shares):.1%} | single trace; service p95 compliance is unknown |",
        "",
        f"Decode TPOT: {sc.decode_tpot_ms:.1f} ms/token ({1000 / sc.decode_tpot_ms:.1f} tokens/s).",
        "",
        "## 3. Observation & Hypotheses",
        "",
        f"- For this trace, TTFT ({a.ttft_ms:.1f} ms) {ttft_verdict} the {t.ttft_p95_ms:.1f} ms target, "
        f"and decode TPOT ({sc.decode_tpot_ms:.1f} ms) {tpot_verdict} the {t.tpot_budget_ms:.1f} ms budget.",
        "- Whether the service meets its p95 SLO is unknown without a request distribution; one trace "
        "establishes neither p95 compliance nor an end-to-end system bottleneck.",
        f"- In this trace, {sc.segments[largest].name} is the largest segment at "
        f"{a.segment_shares[largest]:.1%} of TTFT; inside {p.segment}, attention accounts for "
        f"{p.attention_share:.1%} ({a.attention_ms:.1f} ms).",
        "",
        "## 4. Proposed Change",
        "",
        f"- {p.change}, with an assumed S_kernel = {s:.2f}x across the entire timed attention portion "
        f"({a.attention_ms:.1f} ms) on matching shapes.",
        f"- Logical HBM traffic of one head's {masking} attention at P = {w.prompt_tokens:,}, d = {m.head_dim}, "
        f"{m.dtype} (closed-form model): {a.baseline_bytes / MiB:.2f} MiB for the three-kernel baseline vs "
        f"{a.flash_bytes / MiB:.2f} MiB tiled ({p.variant}), {a.baseline_bytes / a.flash_bytes:.2f}x fewer bytes "
        f"against the matched {masking} baseline. A byte ratio is not a time ratio: S_kernel stays an "
        "assumption until both paths are timed on the same shape.",
        "",
        f"## 5. Projected Impact (Amdahl's law within the {p.segment} boundary)",
        "",
        f"- {p.segment} boundary: attention share f_attn = {p.attention_share:.2f}, "
        f"non-attention {1 - p.attention_share:.2f}.",
        "",
        f"  S_segment = 1 / ({1 - p.attention_share:.2f} + {p.attention_share:.2f} / {s:.2f}) = "
        f"1 / {1 / seg.speedup:.6f} = {seg.speedup:.4f}x",
        "",
        f"  T_segment_projected = {a.other_ms:.1f} ms + ({a.attention_ms:.1f} ms / {s:.2f}) = "
        f"{a.segment_projected_ms:.2f} ms ({seg.latency_reduction:.2%} reduction)",
        "",
        f"- Client TTFT boundary (this trace only), holding the other serial segments fixed ({held}):",
        "",
        f"  T_client_projected = {a.ttft_projected_ms:.2f} ms (S_client = {a.ttft_ms:.1f} / "
        f"{a.ttft_projected_ms:.2f} = {client.speedup:.4f}x, {client.latency_reduction:.2%} reduction)",
        "",
        f"  This trace {projected_verdict} the {t.ttft_p95_ms:.1f} ms target after the change. It is a "
        "conditional projection for one trace: service-level p95 compliance stays unverified until a "
        "post-change distribution is collected.",
        "",
        "## 6. Boundary Errors to Avoid",
        "",
        f"- Kernel vs. end-to-end: applying {s:.2f}x to TTFT predicts {a.ttft_ms:.1f} / {s:.2f} = "
        f"{a.kernel_applied_to_ttft_ms:.1f} ms, ignoring non-attention compute and the other segments.",
        f"- FLOP share vs. time share: attention is {a.flop_share.share:.1%} of prefill FLOPs at "
        f"P = {w.prompt_tokens:,} (2 x parameters per token plus the {masking} QK^T and PV matmuls). Amdahl "
        f"on that share would project {flop_projection:.3f}x for the segment instead of {seg.speedup:.3f}x: "
        f"the FLOP share omits non-matmul work and stalls, so it cannot stand in for the observed "
        f"time share ({p.attention_share:.1%}).",
        "- Unmeasured components: holding "
        + ", ".join(f"{segment.name} at {segment.ms:.1f} ms" for segment in others)
        + " is a static assumption; queuing dynamics under load must be measured.",
        "",
        "## 7. Next Measurement Plan",
        "",
        "- Confirm fused kernel dispatch with `with sdpa_kernel(SDPBackend.FLASH_ATTENTION):`.",
        f"- Validate {p.segment} time against the {a.segment_projected_ms:.2f} ms projection using matched "
        "profiler spans (CUDA events / torch.profiler).",
        "- Monitor server histograms (request_prefill_time_seconds, request_queue_time_seconds) for "
        "server-side elapsed-time distributions.",
        f"- Collect client-observed request samples to accept or reject the service p95 TTFT SLO "
        f"(<= {t.ttft_p95_ms:.1f} ms).",
        "- Measure physical memory traffic with Nsight Compute (dram__bytes_read.sum, dram__bytes_write.sum): "
        f"the {a.flash_bytes / MiB:.2f} MiB per head above is a logical, cold-cache count, not a hardware "
        "guarantee.",
        "",
    ]
    return "\n".join(lines)
