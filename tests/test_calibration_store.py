"""Storing and reading calibrations on a real DuckDB file: write, list, get, drift, partial."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import duckdb
import pytest

from advisor.calibrations import (
    get_calibration,
    list_calibrations,
    parameter_drift,
    profile_for,
    resolve_id,
    usable,
)
from advisor.errors import BadInput
from advisor.profile import load_profile
from advisor.store import connect, scalar
from calibration.records import CalibrationHeader, store_calibration, sum_deltas, summarize
from calibration.schemas import ReplayRecord, ReplayRequest, SegmentRun, SpecDecodeDelta

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).replace(tzinfo=None)


def make_runs(
    key: str, task: str, accepted: int, n: int = 4, rounds: int = 1
) -> tuple[list[SegmentRun], dict[str, ReplayRequest]]:
    """`rounds` rounds of `n` requests on both servers; the speculative one drafted 100 times."""
    requests: dict[str, ReplayRequest] = {}
    runs = []
    for rnd in range(rounds):
        ids = [f"{key}-{rnd}-{i}" for i in range(n)]
        for rid in ids:
            requests[rid] = ReplayRequest(
                request_id=rid,
                segment_key=key,
                prompt="x " * 50,
                prompt_tokens=100,
                max_tokens=64,
                temperature=0.0,
                task=task,
            )
        for role, tpot in (("baseline", 10.0), ("speculative", 5.0)):
            records = [
                ReplayRecord(
                    request_id=rid,
                    segment_key=key,
                    role=role,
                    prompt_tokens=100,
                    output_tokens=64,
                    max_tokens=64,
                    temperature=0.0,
                    ttft_ms=20.0,
                    tpot_ms=tpot,
                    e2e_ms=20.0 + 63 * tpot,
                )
                for rid in ids
            ]
            delta = (
                SpecDecodeDelta(
                    num_drafts=100,
                    num_draft_tokens=400,
                    num_accepted_tokens=accepted,
                    accepted_per_pos=[
                        accepted // 2,
                        accepted // 4,
                        accepted // 8,
                        accepted - accepted // 2 - accepted // 4 - accepted // 8,
                    ],
                )
                if role == "speculative"
                else None
            )
            runs.append(
                SegmentRun(
                    segment_key=key,
                    role=role,
                    concurrency=2,
                    round=rnd,
                    records=records,
                    delta=delta,
                    wall_s=1.0,
                )
            )
    return runs, requests


def header(status: str = "complete", bandwidth: float = 0.8, **extra: object) -> CalibrationHeader:
    return CalibrationHeader(
        created_at=WHEN,
        finished_at=WHEN,
        status=status,
        gpu="h200",
        vllm_version="0.26.0",
        target="llama-3.1-8b",
        method="eagle3",
        k=4,
        settings={"precision": 0.05, "baseline_url": "http://127.0.0.1:1"},
        profile={"bandwidth_efficiency": bandwidth, "methods": {"eagle3": {"step_overhead_ms": 2}}},
        fit={"acceptance": {"rmse": 0.01}},
        **extra,
    )


def store_two_segments(con: duckdb.DuckDBPyConnection, **kw: object) -> int:
    runs_a, req_a = make_runs("json", "json", accepted=300, rounds=2)
    runs_b, req_b = make_runs("story", "story", accepted=80)
    runs, requests = runs_a + runs_b, {**req_a, **req_b}
    segments = [summarize(k, runs, requests) for k in ("json", "story")]
    return store_calibration(con, header(**kw), runs, segments, requests)


def test_store_writes_header_samples_and_segments(con):
    cal_id = store_two_segments(con)
    assert scalar(con, "SELECT count(*) FROM calibration_samples WHERE calibration_id = ?",
                  [cal_id]) == (8 + 4) * 2  # fmt: skip
    cal = get_calibration(con, cal_id)
    assert (cal.gpu, cal.vllm_version, cal.method, cal.k, cal.status) == (
        "h200",
        "0.26.0",
        "eagle3",
        4,
        "complete",
    )
    assert cal.n_samples == 24 and cal.n_segments == 2
    by_key = {s.segment_key: s for s in cal.segments}
    json_seg = by_key["json"]
    # two rounds of 100 drafts, 300 accepted each: 1 + 600/200 = 4 tokens per step
    assert json_seg.mean_acceptance_length == pytest.approx(4.0)
    assert json_seg.acceptance_rate == pytest.approx(0.75)
    assert json_seg.n_requests == 8 and json_seg.task == "json"
    assert sum(json_seg.accepted_per_pos) == 600
    assert json_seg.alpha > by_key["story"].alpha
    assert json_seg.decode_speedup == pytest.approx(2.0)
    assert cal.settings["precision"] == 0.05
    assert cal.profile["bandwidth_efficiency"] == 0.8
    seqs = con.execute(
        "SELECT seq FROM calibration_samples WHERE segment_key = 'json' AND role = 'baseline'"
        " ORDER BY seq"
    ).fetchall()
    assert [s[0] for s in seqs] == list(range(8))


def test_ids_list_and_latest(con):
    first = store_two_segments(con)
    second = store_two_segments(con, status="partial", stop_reason="--max-minutes 5 reached")
    listed = list_calibrations(con)
    assert [c.id for c in listed] == [first, second]
    assert listed[1].status == "partial" and "PARTIAL" in listed[1].describe()
    assert resolve_id(con, "latest") == first  # newest *complete* one
    with pytest.raises(BadInput, match=rf"no calibration 99 .*known: {first}, {second}"):
        get_calibration(con, 99)
    with pytest.raises(BadInput, match="not a number"):
        resolve_id(con, "abc")


def test_partial_is_refused_unless_allowed(con):
    cal = get_calibration(con, store_two_segments(con, status="partial", stop_reason="interrupted"))
    with pytest.raises(BadInput, match=r"partial \(interrupted\).*--allow-partial"):
        usable(cal)
    assert usable(cal, allow_partial=True) is cal


def test_failed_store_leaves_nothing(con):
    """A row that breaks a constraint rolls the whole calibration back."""
    runs, requests = make_runs("json", "json", accepted=300)
    seg = summarize("json", runs, requests)
    with pytest.raises(duckdb.Error):
        store_calibration(con, header(), runs, [seg, seg], requests)  # duplicate segment key
    assert scalar(con, "SELECT count(*) FROM calibrations") == 0
    assert scalar(con, "SELECT count(*) FROM calibration_samples") == 0


def test_drift_lists_changed_parameters(con):
    a = get_calibration(con, store_two_segments(con, bandwidth=0.8))
    b = get_calibration(con, store_two_segments(con, bandwidth=0.6))
    drift = {d.parameter: d for d in parameter_drift(a, b)}
    assert set(drift) == {"bandwidth_efficiency"}
    assert drift["bandwidth_efficiency"].change_pct == pytest.approx(-25.0)


def test_calibrations_survive_reopen_and_read_only(db_path):
    con = connect(db_path)
    cal_id = store_two_segments(con)
    con.close()
    ro = connect(db_path, read_only=True)
    assert [c.id for c in list_calibrations(ro)] == [cal_id]
    ro.close()


def test_sum_deltas_adds_rounds():
    d = sum_deltas(
        [
            SpecDecodeDelta(
                num_drafts=1, num_draft_tokens=4, num_accepted_tokens=2, accepted_per_pos=[1, 1]
            ),
            SpecDecodeDelta(
                num_drafts=2, num_draft_tokens=8, num_accepted_tokens=5, accepted_per_pos=[2, 2, 1]
            ),
        ]
    )
    assert d is not None
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (3, 12, 7)
    assert d.accepted_per_pos == [3, 3, 1]
    assert sum_deltas([]) is None


def test_profile_for_names_the_calibration_and_refuses_what_it_cannot_use(con):
    fitted = load_profile("h200").model_dump(mode="json")
    fitted["acceptance_logit"] = [{"method": "eagle3", "intercept": 1.0, "task": {"json": 0.5}}]
    good = store_two_segments(con)
    con.execute("UPDATE calibrations SET profile = ? WHERE id = ?", [json.dumps(fitted), good])
    profile = profile_for(con, good)
    assert profile.calibration.kind == "calibration" and profile.calibration.id == str(good)
    assert "calibration 1" in profile.calibration.description
    assert profile.acceptance_logit[0].task == {"json": 0.5}
    assert profile_for(con, "latest").calibration.id == str(good)

    partial = store_two_segments(con, status="partial", stop_reason="interrupted")
    con.execute("UPDATE calibrations SET profile = ? WHERE id = ?", [json.dumps(fitted), partial])
    with pytest.raises(BadInput, match=r"partial \(interrupted\)"):
        profile_for(con, partial)
    assert profile_for(con, partial, allow_partial=True).calibration.id == str(partial)

    unreadable = store_two_segments(con)  # its stored profile lacks required fields
    with pytest.raises(BadInput, match=rf"Calibration {unreadable} stores a profile .*cannot read"):
        profile_for(con, unreadable)


def test_replayed_batches_become_waves_for_the_step_fit():
    """16 requests at concurrency 2 are 8 waves of 2: one wave is a batch of 2 taking 1/8 of
    the wall time; acceptance counts every decode step (64 tokens: 63 steps minus accepted)."""
    from calibration.run import RunSettings, step_measurements

    runs, _ = make_runs("json", "json", accepted=0, n=16)
    base_run, spec_run = runs
    spec_run = spec_run.model_copy(
        update={"delta": SpecDecodeDelta(num_drafts=500, num_draft_tokens=2000,
                                         num_accepted_tokens=500, accepted_per_pos=[500])}
    )  # fmt: skip
    settings = RunSettings(target="llama-3.1-8b", method="ngram", k=4)
    base_point, spec_point = step_measurements([base_run, spec_run], settings)
    assert (base_point.method, base_point.k, base_point.batch) == ("baseline", 0, 2)
    assert base_point.wall_s == pytest.approx(1.0 * 2 / 16)
    assert (spec_point.method, spec_point.k) == ("ngram", 4)
    steps = 16 * 63 - 500
    assert spec_point.mean_acceptance_length == pytest.approx(1 + 500 / steps)
