"""`advisor recommend` end to end on the real Azure traces, the fleet summary, the renderers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from advisor.profile import get_profile
from advisor.recommend import fleet_summary, recommend
from advisor.report import markdown, table, to_html
from advisor.schemas import (
    Deployment,
    Interval,
    MemoryFit,
    Recommendation,
    SegmentStats,
    SegmentVerdict,
)
from advisor.segments import Filters
from tests.conftest import AZURE_2023, run_cli

CODE, CONV = AZURE_2023 / "code.csv", AZURE_2023 / "conv.csv"


def recommend_json(*args: str, db: Path) -> Recommendation:
    done = run_cli("recommend", *args, "--format", "json", db=db)
    assert done.returncode == 0, done.stderr
    return Recommendation.model_validate_json(done.stdout)


def weighted(rec: Recommendation, field: str) -> float:
    return sum(s.share * getattr(s, field) for s in rec.segments)


def test_code_trace_gains_much_less_than_conv_and_the_reasons_say_why(db_path: Path):
    code = recommend_json(str(CODE), db=db_path)
    conv = recommend_json(str(CONV), db=db_path)
    for rec, n in ((code, 8819), (conv, 19366)):
        assert sum(s.n for s in rec.segments) == n
        assert sum(s.share for s in rec.segments) == pytest.approx(1.0)
        assert rec.concurrency_estimated and all(
            s.stats.concurrency_estimated for s in rec.segments
        )
        assert any("Concurrency estimated" in note for note in rec.notes)
        assert rec.calibration.id and any(rec.calibration.id in note for note in rec.notes)
    code_gain = code.summary.e2e_speedup_if_all_enabled.value - 1.0
    conv_gain = conv.summary.e2e_speedup_if_all_enabled.value - 1.0
    assert conv_gain > 0.2 and code_gain < conv_gain / 3
    assert weighted(code, "decode_share") + 0.25 < weighted(conv, "decode_share")
    assert sum(s.share * s.e2e_speedup.value for s in code.segments) < sum(
        s.share * s.e2e_speedup.value for s in conv.segments
    )
    # the reasons name the decode share with the numbers behind it (output p50 13 vs 129)
    for rec in (code, conv):
        for seg in rec.segments:
            share_reason = next(r for r in seg.reasons if "Decode share" in r)
            assert f"output p50 {seg.stats.output_p50:.0f}" in share_reason
    assert code.summary.requests_per_s == pytest.approx(8819 / 3436, rel=0.01)


def test_no_flags_table_then_json_from_the_stored_import(db_path: Path):
    first = run_cli("recommend", str(CODE), db=db_path)
    assert first.returncode == 0, first.stderr
    assert "calibration: roofline" in first.stdout or "calibration: h200" in first.stdout
    assert "Fleet summary" in first.stdout and "S1" in first.stdout
    assert re.search(r"\b(enable|disable|try-it)\b", first.stdout)
    again = run_cli("recommend", str(CODE), "--format", "json", db=db_path)
    assert "already imported" in again.stderr  # the same file is not imported twice
    stored = recommend_json("--import", "1", db=db_path)
    assert [s.model_dump() for s in stored.segments] == [
        s.model_dump() for s in Recommendation.model_validate_json(again.stdout).segments
    ]
    raw = json.loads(again.stdout)  # the documented schema
    assert raw["schema_version"] == "1"
    assert {"deployment", "calibration", "summary", "segments", "notes"} <= raw.keys()
    seg = raw["segments"][0]
    for key in ("share", "n", "verdict", "reasons", "best_k"):
        assert key in seg
    for key in ("acceptance", "decode_speedup", "e2e_speedup"):
        assert set(seg[key]) == {"value", "low", "high"}
        assert seg[key]["low"] <= seg[key]["value"] <= seg[key]["high"]
    assert set(raw["summary"]["e2e_speedup"]) == {"value", "low", "high"}
    doc = (Path(__file__).parent.parent / "docs" / "recommendation-schema.md").read_text()
    for field in ("schema_version", "e2e_speedup_if_all_enabled", "concurrency_curve"):
        assert f"`{field}`" in doc


def test_markdown_and_html_reports(db_path: Path, tmp_path: Path):
    md_path, html_path = tmp_path / "r.md", tmp_path / "r.html"
    done = run_cli("recommend", str(CONV), "--format", "markdown", "--output", str(md_path),
                   db=db_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "calibration" in done.stderr
    md = md_path.read_text()
    assert md.startswith("# Speculative decoding recommendation")
    assert "| seg | segment | share |" in md and "## Reasons" in md and "Decode share" in md
    done = run_cli("recommend", "--format", "html", "-o", str(html_path), db=db_path)
    assert done.returncode == 0, done.stderr
    page = html_path.read_text()
    assert page.count("<svg") == 3 and "<polyline" in page
    assert not re.search(r"(https?:)?//[a-z]", page), "the report must open offline"
    assert "<script" not in page and "<link" not in page


def test_filters_and_bands_from_flags(code_db: Path):
    narrow = recommend_json(
        "--since", "2023-11-16T18:30:00", "--until", "2023-11-16T18:40:00",
        "--prompt-bands", "100000", "--output-bands", "100000", "--concurrency-bands", "100000",
        db=code_db,
    )  # fmt: skip
    assert len(narrow.segments) == 1
    assert 0 < narrow.segments[0].n < 8819


def test_min_share_zero_keeps_every_cell(code_db: Path):
    from advisor.segments import Bands
    from advisor.store import connect

    con = connect(code_db, read_only=True)
    merged = recommend(con, Deployment(), bands=Bands())
    unmerged = recommend(con, Deployment(), bands=Bands(min_share=0))
    assert len(unmerged.segments) > len(merged.segments)
    assert sum(s.n for s in unmerged.segments) == sum(s.n for s in merged.segments) == 8819
    assert min(s.share for s in merged.segments) >= 0.02


@pytest.fixture(scope="module")
def code_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One database holding code.csv, shared by the bad-flag cases (none of them writes)."""
    from advisor.store import connect
    from collectors.ingest import ingest_file

    path = tmp_path_factory.mktemp("code") / "advisor.duckdb"
    con = connect(path)
    ingest_file(con, CODE)
    con.close()
    return path


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "h900"], "h200"),
        (["--target", "llama-9b"], "llama-3.1-8b"),
        (["--format", "pdf"], "markdown"),
        (["--calibration", "99"], "calibration 99"),
        (["--since", "yesterday"], "--since"),
    ],
)
def test_bad_flags_exit_2_with_what_is_valid(code_db: Path, args: list[str], says: str):
    done = run_cli("recommend", *args, db=code_db)
    assert done.returncode == 2, done.stdout
    assert says in done.stderr and "Traceback" not in done.stderr


def test_other_bad_inputs_are_one_sentence_errors(code_db: Path):
    from advisor.errors import BadInput
    from advisor.recommend import resolve_profile
    from advisor.store import connect
    from cli.predict import make_deployment
    from cli.recommend import make_bands, parse_time

    con = connect(code_db, read_only=True)
    cases = [
        (lambda: make_deployment("h200", "llama-3.1-8b", "magic", None, "auto", 0.9, 1), "eagle3"),
        (lambda: make_deployment("h200", "llama-3.1-8b", "eagle3", None, "many", 0.9, 1), "--k"),
        (lambda: make_bands("512,abc", None, None, None, 0.02), "--prompt-bands"),
        (lambda: make_bands(None, None, None, None, 0.9), "--min-share"),
        (lambda: resolve_profile(con, "h200", "no-such-profile"), "advisor calibrations list"),
        (lambda: recommend(con, Deployment(), filters=Filters(model="nope")), "No requests"),
    ]
    for call, says in cases:
        with pytest.raises(BadInput, match=re.escape(says)):
            call()
    assert parse_time("--since", "2024-01-31T12:00:00+02:00").hour == 10


def test_a_stored_calibration_is_used_and_named(con, db_path: Path):
    from collectors.ingest import ingest_file

    ingest_file(con, CODE)
    fitted = get_profile("roofline").model_copy(update={"name": "fitted", "gpu": "h200"})
    con.execute(
        "INSERT INTO calibrations (id, created_at, finished_at, status, gpu, target, method, k,"
        " settings, profile, fit) VALUES (1, now(), now(), 'complete', 'h200', 'llama-3.1-8b',"
        " 'eagle3', 4, '{}', ?, '{}')",
        [fitted.model_dump_json()],
    )
    con.close()
    rec = recommend_json("--calibration", "1", db=db_path)
    assert (rec.calibration.kind, rec.calibration.id) == ("calibration", "1")
    assert any(note.startswith("Calibration used: 1 (calibration)") for note in rec.notes)


def _verdict(share: float, latency: float, speedup: float, verdict: str, conc: float,
             throughput: float) -> SegmentVerdict:  # fmt: skip
    stats = SegmentStats(
        key="k", task="chat", temperature_band="unknown", prompt_band="<512", output_band="any",
        concurrency_band="<4", n=int(share * 100), share=share, prompt_p50=100, prompt_p95=200,
        output_p50=100, output_p95=200, temperature_p50=None, concurrency_p50=conc,
        concurrency_p95=conc, concurrency_estimated=False,
    )  # fmt: skip
    memory = MemoryFit(gpu_memory_gb=141, budget_gb=127, target_weights_gb=16,
                       draft_weights_gb=1, kv_needed_gb=2, kv_available_gb=108, headroom_gb=106,
                       fits=True)  # fmt: skip
    iv = Interval(value=speedup, low=speedup - 0.5, high=speedup + 0.5)
    return SegmentVerdict(
        stats=stats, share=share, n=stats.n, verdict=verdict, method="eagle3", best_k=3,
        acceptance=Interval(value=0.7, low=0.5, high=0.8), decode_speedup=iv, e2e_speedup=iv,
        throughput_change=Interval(value=throughput, low=throughput, high=throughput),
        decode_share=0.5, memory=memory, reasons=["<b>why</b>"], baseline_latency_s=latency,
    )  # fmt: skip


def test_fleet_summary_weights_by_request_time_and_counts_gpu_hours():
    fast = _verdict(0.5, latency=1.0, speedup=2.0, verdict="enable", conc=2, throughput=1.25)
    slow = _verdict(0.5, latency=3.0, speedup=1.5, verdict="try-it", conc=1, throughput=1.0)
    s = fleet_summary([fast, slow], rate=1.0, tp=1)
    # mean latency 2.0 s before; after following the verdicts 0.5*1/2 + 0.5*3 = 1.75 s
    assert s.e2e_speedup.value == pytest.approx(2.0 / 1.75, abs=1e-4)
    assert s.e2e_speedup.low == pytest.approx(2.0 / (0.5 / 1.5 + 1.5), abs=1e-4)
    assert s.e2e_speedup_if_all_enabled.value == pytest.approx(2.0 / 1.25, abs=1e-4)
    assert s.latency_change_pct == pytest.approx(-12.5, abs=0.01)
    # GPU-hours/day = 24 h x (0.5 x 1 s / 2 + 0.5 x 3 s / 1); saved: fast x (1 - 1/1.25)
    assert s.baseline_gpu_hours_per_day == pytest.approx(42.0)
    assert s.gpu_hours_saved_per_day == pytest.approx(24 * 0.25 * 0.2)
    assert (s.segments_enabled, s.segments_try_it, s.segments_disabled) == (1, 1, 0)
    assert fleet_summary([fast], rate=None, tp=1).baseline_gpu_hours_per_day is None


def test_renderers_escape_and_show_every_segment():
    segs = [_verdict(0.6, 1.0, 2.0, "enable", 2, 1.2), _verdict(0.4, 2.0, 0.9, "disable", 8, 0.8)]
    segs[1].stats.task = "<script>alert(1)</script>"
    summary = fleet_summary(segs, rate=2.0, tp=1)
    rec = Recommendation(
        deployment=Deployment(), calibration=get_profile("roofline").calibration,
        concurrency_estimated=False, notes=["a note"], summary=summary, segments=segs,
    )  # fmt: skip
    page = to_html(rec)
    assert "<script" not in page and "&lt;script&gt;" in page and "&lt;b&gt;why" in page
    md = markdown(rec)
    assert md.count("| S") == 2 and "**disable**" in md and "a note" in md
    from rich.console import Console

    console = Console(record=True, width=240)
    console.print(table(rec))
    text = console.export_text()
    assert "S1" in text and "S2" in text and "GPU-hours saved per day" in text


def test_default_batch_limit_follows_vllm_per_gpu():
    from advisor.catalog import get_gpu
    from advisor.recommend import default_max_num_seqs

    assert [default_max_num_seqs(get_gpu(g)) for g in ("h200", "a100-80g", "l40s")] == [
        1024, 256, 256
    ]  # fmt: skip


def test_recommend_api_on_an_open_connection(con):
    from collectors.ingest import ingest_file

    ingest_file(con, CODE)
    rec = recommend(con, Deployment(method="ngram"), filters=Filters(import_ids=[1]))
    assert rec.deployment.method == "ngram" and all(s.method == "ngram" for s in rec.segments)
    curve = rec.segments[0].concurrency_curve
    assert [p.concurrency for p in curve][:3] == [1, 2, 4]
    assert all(s.baseline_latency_s and s.baseline_latency_s > 0 for s in rec.segments)
