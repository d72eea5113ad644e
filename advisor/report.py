"""Renderers of a Recommendation: rich table, markdown, self-contained HTML, JSON.

All four read only the Recommendation, so the CLI and the REST API show the same numbers. The JSON
is `Recommendation.model_dump_json` (schema documented in docs/recommendation-schema.md). The HTML
opens offline: no scripts, fonts or stylesheets from anywhere, and its plots are inline SVG drawn
here (speedup against concurrency per segment, where request time goes, memory budget).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from advisor.schemas import Interval, Recommendation, SegmentVerdict

VERDICT_STYLE = {"enable": "bold green", "disable": "bold red", "try-it": "bold yellow"}
VERDICT_COLOUR = {"enable": "#1a7f37", "disable": "#cf222e", "try-it": "#9a6700"}
SEGMENT_COLOURS = (
    "#0969da",
    "#bf3989",
    "#1a7f37",
    "#9a6700",
    "#8250df",
    "#cf222e",
    "#1b7c83",
    "#57606a",
    "#fb8500",
    "#6639ba",
    "#0550ae",
    "#116329",
)


def fmt_x(value: float) -> str:
    return f"{value:.2f}x"


def fmt_interval(iv: Interval, unit: str = "x", digits: int = 2) -> str:
    """`1.42x (1.21-1.63)`."""
    return f"{iv.value:.{digits}f}{unit} ({iv.low:.{digits}f}-{iv.high:.{digits}f})"


def fmt_count(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:.1f}"


def label(i: int) -> str:
    """Segments are S1, S2, ... in every renderer."""
    return f"S{i + 1}"


def short_key(seg: SegmentVerdict) -> str:
    """`code T<0.3 P512-2048 O<32 C4-16`: the segment's bands in table-sized form."""
    st = seg.stats
    temp = "?" if st.temperature_band == "unknown" else st.temperature_band
    return (
        f"{st.task} T{temp} P{st.prompt_band} O{st.output_band} C{st.concurrency_band}"
    ).replace(" or unknown", "|?")


COLUMNS = (
    ("seg", "left"),
    ("segment", "left"),
    ("share", "right"),
    ("n", "right"),
    ("prompt p50", "right"),
    ("output p50", "right"),
    ("conc p50/p95", "right"),
    ("acceptance", "right"),
    ("decode speedup", "right"),
    ("e2e speedup", "right"),
    ("mem headroom", "right"),
    ("verdict", "left"),
    ("k", "right"),
)
LEGEND = (
    "T temperature, P prompt tokens, O output tokens, C requests in flight; in/out: prompt and"
    " output tokens p50; conc: in flight p50/p95 (~ estimated); speedups and acceptance over"
    " their 90% interval."
)


def concurrency_text(seg: SegmentVerdict, digits: int | None = None) -> str:
    """`~8/14`: p50/p95 requests in flight, `~` when estimated from arrivals."""
    marker = "~" if seg.stats.concurrency_estimated else ""
    st = seg.stats
    if digits is not None:
        return f"{marker}{st.concurrency_p50:,.{digits}f}/{st.concurrency_p95:,.{digits}f}"
    return f"{marker}{fmt_count(st.concurrency_p50)}/{fmt_count(st.concurrency_p95)}"


def headline(rec: Recommendation) -> str:
    """One line saying what was asked and which numbers answered it."""
    d = rec.deployment
    draft = f" draft {d.draft}" if d.draft else ""
    k = d.k if d.k is not None else "auto"
    return (
        f"{d.target} on {d.gpu} (tp {d.tp}, gpu-memory-utilization {d.gpu_memory_utilization}),"
        f" {d.method}{draft}, k {k}; calibration: {rec.calibration.id} ({rec.calibration.kind},"
        " described in the notes)"
    )


def summary_lines(rec: Recommendation) -> list[str]:
    """The fleet summary in plain sentences."""
    s = rec.summary
    change = s.latency_change_pct
    direction = "faster" if change < 0 else "slower" if change > 0 else "unchanged"
    lines = [
        "Following every verdict: traffic-weighted end-to-end speedup"
        f" {fmt_interval(s.e2e_speedup)}, mean request latency {abs(change):.1f}% {direction}.",
        *(
            [
                "Enabling every segment instead (the potential, try-it segments included):"
                f" {fmt_interval(s.e2e_speedup_if_all_enabled)}."
            ]
            if s.e2e_speedup_if_all_enabled is not None
            else []
        ),
        f"Verdicts: {s.segments_enabled} enable, {s.segments_try_it} try-it,"
        f" {s.segments_disabled} disable.",
    ]
    if s.requests_per_s is not None and s.baseline_gpu_hours_per_day is not None:
        saved = s.gpu_hours_saved_per_day
        verb = "saved" if saved >= 0 else "lost"
        lines.append(
            f"GPU-hours {verb} per day: {abs(saved):.2f} of {s.baseline_gpu_hours_per_day:.2f}"
            f" at the trace's {s.requests_per_s:.2f} requests/s."
        )
    return lines


# --- terminal -------------------------------------------------------------------------------

# COLUMNS squeezed for a 120-column terminal: the label joins the segment, prompt and output p50
# share a column, intervals go under their values.
TERMINAL_COLUMNS = (
    ("segment", "left"),
    ("share", "right"),
    ("n", "right"),
    ("in/out", "right"),
    ("conc", "right"),
    ("accept", "right"),
    ("decode", "right"),
    ("e2e", "right"),
    ("mem free", "right"),
    ("verdict", "left"),
    ("k", "right"),
)


def _two_lines(iv: Interval, unit: str = "x") -> str:
    """The value over its interval, so the column stays narrow."""
    return f"{iv.value:.2f}{unit}\n{iv.low:.2f}-{iv.high:.2f}"


def table(rec: Recommendation) -> Group:
    """A rich renderable: headline, one row per segment, reasons, fleet summary, notes."""
    t = Table(title="Speculative decoding, per segment", title_justify="left")
    for name, justify in TERMINAL_COLUMNS:
        t.add_column(name, justify=justify, no_wrap=name != "segment", min_width=len(name))
    for i, seg in enumerate(rec.segments):
        st = seg.stats
        t.add_row(
            f"{label(i)} {short_key(seg)}",
            f"{seg.share:.1%}",
            f"{seg.n:,}",
            f"{fmt_count(st.prompt_p50)}/{fmt_count(st.output_p50)}",
            concurrency_text(seg, digits=0),
            _two_lines(seg.acceptance, unit=""),
            _two_lines(seg.decode_speedup),
            _two_lines(seg.e2e_speedup),
            f"{seg.memory.headroom_gb:.0f} GB",
            Text(seg.verdict, style=VERDICT_STYLE[seg.verdict]),
            str(seg.best_k),
        )
    parts: list[object] = [Text(headline(rec), style="bold"), t, Text(LEGEND, style="dim")]
    for i, seg in enumerate(rec.segments):
        parts.append(
            Text.assemble(
                (f"{label(i)} ", "bold"),
                (seg.verdict, VERDICT_STYLE[seg.verdict]),
                f"  {seg.stats.key}",
            )
        )
        parts.extend(Text(f"   - {r}") for r in seg.reasons)
        if seg.what_to_measure:
            parts.append(Text(f"   - measure: {seg.what_to_measure}", style="yellow"))
    parts.append(Text("Fleet summary", style="bold"))
    parts.extend(Text(f"  {line}") for line in summary_lines(rec))
    parts.extend(Text(f"  note: {n}", style="dim") for n in rec.notes)
    return Group(*parts)


# --- markdown -------------------------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(rec: Recommendation) -> str:
    """A review-ready markdown report: the same table, reasons and summary as the terminal."""
    out = [
        "# Speculative decoding recommendation",
        "",
        f"**Deployment and calibration:** {_md(headline(rec))}",
        "",
        "| " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|" + "|".join("--:" if j == "right" else "---" for _, j in COLUMNS) + "|",
    ]
    for i, seg in enumerate(rec.segments):
        st = seg.stats
        out.append(
            f"| {label(i)} | {_md(short_key(seg))} | {seg.share:.1%} | {seg.n:,}"
            f" | {fmt_count(st.prompt_p50)} | {fmt_count(st.output_p50)} | {concurrency_text(seg)}"
            f" | {fmt_interval(seg.acceptance, unit='')} | {fmt_interval(seg.decode_speedup)}"
            f" | {fmt_interval(seg.e2e_speedup)} | {seg.memory.headroom_gb:.1f} GB"
            f" | **{seg.verdict}** | {seg.best_k} |"
        )
    out += ["", LEGEND, "", "## Reasons", ""]
    for i, seg in enumerate(rec.segments):
        out.append(f"**{label(i)} - {seg.verdict}** ({_md(seg.stats.key)})")
        out.append("")
        out += [f"- {r}" for r in seg.reasons]
        if seg.what_to_measure:
            out.append(f"- measure: {seg.what_to_measure}")
        out.append("")
    out += ["## Fleet summary", ""] + [f"- {line}" for line in summary_lines(rec)]
    if rec.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in rec.notes]
    out.append(f"\n_schema_version {rec.schema_version}_\n")
    return "\n".join(out)


# --- json -----------------------------------------------------------------------------------


def to_json(rec: Recommendation) -> str:
    return rec.model_dump_json(indent=2)


# --- html -----------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;
color:#1f2328;padding:0 1em}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:right}
th{background:#f6f8fa} td.l,th.l{text-align:left}
.enable{color:#1a7f37;font-weight:600}.disable{color:#cf222e;font-weight:600}
.try-it{color:#9a6700;font-weight:600}
.plot{margin:1em 0} .note{color:#57606a}
svg text{font:11px system-ui,sans-serif;fill:#1f2328}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def to_html(rec: Recommendation) -> str:
    """A self-contained HTML page (inline CSS and SVG, nothing fetched)."""
    rows = []
    for i, seg in enumerate(rec.segments):
        st = seg.stats
        cells = [
            (label(i), "l"),
            (short_key(seg), "l"),
            (f"{seg.share:.1%}", ""),
            (f"{seg.n:,}", ""),
            (fmt_count(st.prompt_p50), ""),
            (fmt_count(st.output_p50), ""),
            (concurrency_text(seg), ""),
            (fmt_interval(seg.acceptance, unit=""), ""),
            (fmt_interval(seg.decode_speedup), ""),
            (fmt_interval(seg.e2e_speedup), ""),
            (f"{seg.memory.headroom_gb:.1f} GB", ""),
            (seg.verdict, f"l {seg.verdict}"),
            (seg.best_k, ""),
        ]
        rows.append("<tr>" + "".join(f'<td class="{c}">{_e(v)}</td>' for v, c in cells) + "</tr>")
    heads = [name for name, _ in COLUMNS]
    reasons = []
    for i, seg in enumerate(rec.segments):
        items = "".join(f"<li>{_e(r)}</li>" for r in seg.reasons)
        if seg.what_to_measure:
            items += f"<li><em>measure:</em> {_e(seg.what_to_measure)}</li>"
        reasons.append(
            f'<h3>{label(i)} <span class="{seg.verdict}">{_e(seg.verdict)}</span>'
            f" <small>{_e(seg.stats.key)}</small></h3><ul>{items}</ul>"
        )
    notes = "".join(f"<li>{_e(n)}</li>" for n in rec.notes)
    summary = "".join(f"<li>{_e(line)}</li>" for line in summary_lines(rec))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Speculative decoding recommendation</title><style>{_CSS}</style></head>
<body>
<h1>Speculative decoding recommendation</h1>
<p>{_e(headline(rec))}</p>
<h2>Fleet summary</h2><ul>{summary}</ul>
<table><tr>{"".join(f'<th class="l">{_e(h)}</th>' for h in heads)}</tr>{"".join(rows)}</table>
<p class="note">{_e(LEGEND)}</p>
<h2>Speedup against concurrency</h2>
<p class="note">Predicted end-to-end speedup of each segment's median request as the number of
requests in flight grows (lines); dots mark the segment's own median concurrency, bars its
interval. Above the dashed line speculation helps; at high concurrency the step turns
compute-bound and the gain shrinks.</p>
<div class="plot">{speedup_plot(rec)}</div>
<h2>Where request time goes</h2>
<p class="note">Share of a median request's time in prefill (not accelerated) and decode, without
speculation (upper bar) and with it (lower bar), both scaled to the baseline time.</p>
<div class="plot">{time_split_plot(rec)}</div>
<h2>Memory budget</h2>
<p class="note">Target weights, draft weights, the runtime reserve and the KV cache the segment
needs at its p95 concurrency and context, against the budget (GPU memory x utilization).</p>
<div class="plot">{memory_plot(rec)}</div>
<h2>Reasons</h2>{"".join(reasons)}
<h2>Notes</h2><ul>{notes}</ul>
<p class="note">schema_version {_e(rec.schema_version)}</p>
</body></html>
"""


def _svg(width: int, height: int, body: Iterable[str]) -> str:
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        + "".join(body)
        + "</svg>"
    )


def _colour(i: int) -> str:
    return SEGMENT_COLOURS[i % len(SEGMENT_COLOURS)]


def speedup_plot(rec: Recommendation, width: int = 760, height: int = 360) -> str:
    """e2e speedup (linear y) against concurrency (log2 x), one line per segment."""
    left, right, top, bottom = 56, 150, 16, 40
    xs = [p.concurrency for s in rec.segments for p in s.concurrency_curve]
    xs += [max(1.0, s.stats.concurrency_p50) for s in rec.segments]
    ys = [p.e2e_speedup for s in rec.segments for p in s.concurrency_curve]
    ys += [v for s in rec.segments for v in (s.e2e_speedup.low, s.e2e_speedup.high)]
    x_lo, x_hi = 0.0, math.log2(max([*xs, 2.0]))
    y_lo, y_hi = min([*ys, 0.9]), max([*ys, 1.2])
    y_lo, y_hi = y_lo - 0.05 * (y_hi - y_lo), y_hi + 0.05 * (y_hi - y_lo)
    pw, ph = width - left - right, height - top - bottom

    def px(c: float) -> float:
        return left + pw * (math.log2(max(c, 1.0)) - x_lo) / (x_hi - x_lo)

    def py(v: float) -> float:
        return top + ph * (1 - (v - y_lo) / (y_hi - y_lo))

    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#d0d7de"/>']
    c = 1
    while c <= 2**x_hi + 1e-9:
        body.append(
            f'<line x1="{px(c):.1f}" y1="{top + ph}" x2="{px(c):.1f}" y2="{top + ph + 4}" '
            f'stroke="#57606a"/><text x="{px(c):.1f}" y="{top + ph + 16}" '
            f'text-anchor="middle">{c}</text>'
        )
        c *= 2
    for v in _ticks(y_lo, y_hi):
        body.append(
            f'<line x1="{left - 4}" y1="{py(v):.1f}" x2="{left + pw}" y2="{py(v):.1f}" '
            f'stroke="#eaeef2"/><text x="{left - 6}" y="{py(v) + 4:.1f}" '
            f'text-anchor="end">{v:.2f}x</text>'
        )
    body.append(
        f'<line x1="{left}" y1="{py(1.0):.1f}" x2="{left + pw}" y2="{py(1.0):.1f}" '
        'stroke="#57606a" stroke-dasharray="5,4"/>'
    )
    body.append(
        f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">'
        "requests in flight (log scale)</text>"
    )
    body.append(
        f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
        'text-anchor="middle">end-to-end speedup</text>'
    )
    for i, seg in enumerate(rec.segments):
        colour = _colour(i)
        pts = " ".join(
            f"{px(p.concurrency):.1f},{py(p.e2e_speedup):.1f}" for p in seg.concurrency_curve
        )
        if pts:
            body.append(
                f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
        # a few pixels apart, so segments at the same concurrency keep visible intervals
        x = px(seg.stats.concurrency_p50) + 3.0 * (i - (len(rec.segments) - 1) / 2)
        iv = seg.e2e_speedup
        body.append(
            f'<line x1="{x:.1f}" y1="{py(iv.low):.1f}" x2="{x:.1f}" y2="{py(iv.high):.1f}" '
            f'stroke="{colour}" stroke-width="2"/><circle cx="{x:.1f}" cy="{py(iv.value):.1f}" '
            f'r="4" fill="{colour}"><title>{_e(label(i))}: {_e(fmt_interval(iv))} at '
            f"{_e(concurrency_text(seg))} in flight</title></circle>"
        )
        ly = top + 14 + 16 * i
        body.append(
            f'<rect x="{left + pw + 12}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + pw + 26}" y="{ly}">{_e(label(i))} '
            f"{_e(seg.verdict)} ({seg.share:.0%})</text>"
        )
    return _svg(width, height, body)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= m * step)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def time_split_plot(rec: Recommendation, width: int = 860) -> str:
    """Per segment: baseline prefill|decode, then speculative prefill|decode/decode speedup."""
    left, bar_w, row = 60, 560, 44
    height = 30 + row * len(rec.segments)
    body = [
        f'<rect x="{left}" y="6" width="12" height="10" fill="#8c959f"/>'
        f'<text x="{left + 16}" y="15">prefill</text>'
        f'<rect x="{left + 80}" y="6" width="12" height="10" fill="#0969da"/>'
        f'<text x="{left + 96}" y="15">decode</text>'
    ]
    for i, seg in enumerate(rec.segments):
        y = 26 + row * i
        decode = min(max(seg.decode_share, 0.0), 1.0)
        prefill = 1.0 - decode
        spec_decode = decode / max(seg.decode_speedup.value, 1e-9)
        body.append(f'<text x="{left - 8}" y="{y + 16}" text-anchor="end">{_e(label(i))}</text>')
        for j, (pre, dec, name) in enumerate(
            ((prefill, decode, "baseline"), (prefill, spec_decode, "speculative"))
        ):
            yy = y + j * 17
            body.append(
                f'<rect x="{left}" y="{yy}" width="{bar_w * pre:.1f}" height="14" fill="#8c959f">'
                f"<title>{_e(label(i))} {name}: prefill {pre:.0%}</title></rect>"
                f'<rect x="{left + bar_w * pre:.1f}" y="{yy}" width="{bar_w * dec:.1f}" height="14"'
                f' fill="#0969da"><title>{_e(label(i))} {name}: decode {dec:.0%}</title></rect>'
                f'<text x="{left + bar_w * (pre + dec) + 6:.1f}" y="{yy + 11}">{name}'
                f" {pre + dec:.0%} (decode {dec:.0%})</text>"
            )
    return _svg(width, height, body)


def memory_plot(rec: Recommendation, width: int = 900) -> str:
    """Per segment: target weights, draft weights, runtime reserve, KV needed; budget line."""
    left, bar_w, row = 60, 520, 26
    height = 30 + row * len(rec.segments)
    scale = max(
        [s.memory.budget_gb for s in rec.segments]
        + [
            s.memory.budget_gb - s.memory.kv_available_gb + s.memory.kv_needed_gb
            for s in rec.segments
        ]
        + [1.0]
    )
    parts = (
        ("target weights", "#57606a"),
        ("draft weights", "#bf3989"),
        ("runtime reserve", "#afb8c1"),
        ("KV needed", "#0969da"),
    )
    body = []
    for j, (name, colour) in enumerate(parts):
        body.append(
            f'<rect x="{left + 130 * j}" y="6" width="12" height="10" fill="{colour}"/>'
            f'<text x="{left + 130 * j + 16}" y="15">{name}</text>'
        )
    for i, seg in enumerate(rec.segments):
        m = seg.memory
        y = 26 + row * i
        x = float(left)
        body.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{_e(label(i))}</text>')
        reserve = max(0.0, m.budget_gb - m.target_weights_gb - m.draft_weights_gb
                      - m.kv_available_gb)  # fmt: skip
        sizes = (m.target_weights_gb, m.draft_weights_gb, reserve, m.kv_needed_gb)
        for (name, colour), gb in zip(parts, sizes, strict=True):
            w = bar_w * gb / scale
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" fill="{colour}">'
                f"<title>{_e(label(i))} {name}: {gb:.1f} GB</title></rect>"
            )
            x += w
        bx = left + bar_w * m.budget_gb / scale
        fits = "fits" if m.fits else "does NOT fit"
        body.append(
            f'<line x1="{bx:.1f}" y1="{y - 3}" x2="{bx:.1f}" y2="{y + 19}" stroke="#cf222e"'
            f' stroke-width="2"/><text x="{left + bar_w + 8}" y="{y + 13}">'
            f"{m.budget_gb:.0f} GB budget, {fits}, headroom {m.headroom_gb:.1f} GB</text>"
        )
    return _svg(width, height, body)
