"""Segmentation and concurrency on hand-made requests in a real DuckDB file."""

from __future__ import annotations

from datetime import datetime

import pytest

from advisor import concurrency
from advisor.errors import BadInput
from advisor.segments import Bands, Filters, band_label, create_scope, parse_edges, segment


def add(con, n: int, *, import_id: int = 1, task: str | None = None, prompt: str = "100",
        output: str = "50", temperature: str = "NULL", conc: str = "NULL",
        arrival: str = "NULL", finish: str = "NULL", model: str | None = None,
        tenant: str | None = None) -> None:  # fmt: skip
    """n rows; the SQL expressions may use i = 0..n-1."""
    con.execute(
        "INSERT INTO requests (request_id, source, import_id, line, arrival_ts, finish_ts,"
        " prompt_tokens, output_tokens, temperature, task, model, tenant, concurrency,"
        " concurrency_source)"
        f" SELECT gen_random_uuid()::VARCHAR, 'test', {import_id}, i, {arrival}, {finish},"
        f" {prompt}, {output}, {temperature}, ?, ?, ?, {conc},"
        f" CASE WHEN {conc} IS NOT NULL THEN 'log' END FROM range({n}) t(i)",
        [task, model, tenant],
    )


def run(con, bands: Bands | None = None, filters: Filters | None = None, service=None):
    create_scope(con, filters or Filters())
    info = concurrency.fill(con, service or (lambda p, o, b: 1.0))
    return segment(con, bands or Bands()), info


def test_percentiles_and_bands_are_computed_per_segment(con):
    add(con, 60, task="code", prompt="1000 + i", output="50", temperature="0.0", conc="2")
    add(con, 40, prompt="100", output="600 + 10 * i", conc="20")
    segs, info = run(con)
    assert [s.task for s in segs] == ["code", "unlabelled"]
    code, rest = segs
    assert (code.n, code.share) == (60, 0.6)
    assert code.prompt_p50 == pytest.approx(1029.5)
    assert code.prompt_p95 == pytest.approx(1000 + 0.95 * 59)
    assert (code.prompt_mean, code.output_mean) == (pytest.approx(1029.5), 50)
    assert (code.output_p50, code.temperature_p50, code.concurrency_p50) == (50, 0.0, 2)
    assert (code.prompt_band, code.output_band, code.temperature_band) == ("512-2048", "32-128",
                                                                             "<0.3")  # fmt: skip
    assert code.concurrency_band == "<4"
    assert rest.output_p50 == pytest.approx(600 + 10 * 19.5)
    assert (rest.temperature_band, rest.temperature_p50, rest.concurrency_band) == (
        "unknown",
        None,
        "16-64",
    )
    assert not code.concurrency_estimated and info.logged == 100 and not info.was_estimated


def test_small_cells_merge_into_the_same_task_first_then_the_nearest_bands(con):
    add(con, 60, task="code", prompt="1000", conc="2")
    add(con, 40, prompt="100", output="600", conc="20")
    add(con, 1, task="code", prompt="3000", conc="2")  # 1% code: joins code, not a closer band
    add(con, 1, task="rare", prompt="100", output="600", conc="20")  # lone task: nearest bands
    segs, _ = run(con)
    by_task = {s.task: s for s in segs}
    assert set(by_task) == {"code", "unlabelled+rare"}
    assert by_task["code"].n == 61 and by_task["code"].prompt_band == "512-8192"
    assert by_task["unlabelled+rare"].n == 41
    assert sum(s.n for s in segs) == 102
    assert sum(s.share for s in segs) == pytest.approx(1.0)

    unmerged, _ = run(con, Bands(min_share=0.0))
    assert len(unmerged) == 4


def test_merging_prefers_the_adjacent_band(con):
    add(con, 50, task="chat", prompt="100", output="10", conc="1")  # prompt band 0
    add(con, 47, task="chat", prompt="9000", output="10", conc="1")  # prompt band 3
    add(con, 3, task="chat", prompt="1000", output="10", conc="1")  # band 1: next to band 0
    segs, _ = run(con, Bands(min_share=0.05))
    assert [(s.n, s.prompt_band) for s in segs] == [(53, "<2048"), (47, ">=8192")]


def test_configured_bands_change_the_segments(con):
    add(con, 50, prompt="100", output="10", conc="1")
    add(con, 50, prompt="300", output="10", conc="1")
    assert len(run(con)[0]) == 1
    segs, _ = run(con, Bands(prompt=[200, 1000]))
    assert sorted(s.prompt_band for s in segs) == ["200-1000", "<200"]


def test_filters_select_imports_time_model_and_tenant(con):
    add(con, 10, import_id=1, model="a", tenant="t1",
        arrival="TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (i) HOUR", conc="1")  # fmt: skip
    add(con, 5, import_id=2, model="b", tenant="t2", conc="1")

    def total(filters: Filters) -> int:
        return sum(s.n for s in run(con, filters=filters)[0])

    assert total(Filters()) == 15
    assert total(Filters(import_ids=[2])) == 5
    assert total(Filters(model="a")) == 10
    assert total(Filters(tenant="t2")) == 5
    window = Filters(since=datetime(2024, 1, 1, 2), until=datetime(2024, 1, 1, 5))
    assert total(window) == 3
    with pytest.raises(BadInput, match="No requests match"):
        create_scope(con, Filters(model="nope"))
    add(con, 4, import_id=3, output="NULL")
    with pytest.raises(BadInput, match="None of the 4 matching requests has an output token"):
        create_scope(con, Filters(import_ids=[3]))
    assert create_scope(con, Filters(import_ids=[1, 3])).without_output == 4


def test_concurrency_is_estimated_from_arrivals_and_service_time(con):
    # one arrival per second, each served in 2.5 s: at every arrival 3 requests are in flight
    add(con, 100, arrival="TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (i) SECOND")
    segs, info = run(con, service=lambda p, o, b: 2.5)
    assert info.estimated == 100 and info.iterations == 2 and info.was_estimated
    assert all(s.concurrency_estimated for s in segs)
    counts = dict(con.execute("SELECT concurrency, count(*) FROM advisor_rows GROUP BY ALL")
                  .fetchall())  # fmt: skip
    assert counts == {1: 1, 2: 1, 3: 98}


def test_estimated_concurrency_is_counted_per_model(con):
    # two models, each one arrival per second served in 2.5 s: 3 in flight on each server
    for model in ("a", "b"):
        add(con, 50, model=model, arrival="TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (i) SECOND")
    scope = create_scope(con, Filters())
    concurrency.fill(con, lambda p, o, b: 2.5)
    assert scope.models == 2
    assert con.execute("SELECT max(concurrency) FROM advisor_rows").fetchall() == [(3,)]


def test_estimation_iterates_on_batch_dependent_service_time(con):
    add(con, 200, arrival="TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (i) SECOND")
    seen: list[float] = []

    def service(p: float, o: float, b: float) -> float:
        seen.append(b)
        return 1.5 * b  # slower at larger batch: batch 1 -> 2 in flight -> 3 s -> 3 in flight

    run(con, service=service)
    assert sorted(set(seen)) == [1.0, pytest.approx(2.0)]
    assert con.execute("SELECT median(concurrency) FROM advisor_rows").fetchall()[0][0] == 3


def test_service_time_batch_is_capped_at_the_engine_limit(con):
    add(con, 200, arrival="TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (i * 100) MILLISECOND")
    seen: list[float] = []

    def service(p: float, o: float, b: float) -> float:
        seen.append(b)
        return 5.0  # 10 arrivals/s x 5 s: about 50 in flight, above the cap of 4

    create_scope(con, Filters())
    info = concurrency.fill(con, service, max_batch=4)
    assert max(seen) == pytest.approx(4.0) and info.max_batch == 4
    assert con.execute("SELECT max(concurrency) FROM advisor_rows").fetchall()[0][0] >= 45


def test_rows_without_arrival_are_assumed_single(con):
    add(con, 10)
    segs, info = run(con)
    assert info.assumed == 10 and info.was_estimated
    assert segs[0].concurrency_p50 == 1 and segs[0].concurrency_estimated is False


def test_exact_overlap_counts_from_finish_times(con):
    # arrivals 0, 1, 2 s; finishes 3, 2, 5 s: the second ends as the third starts
    add(con, 3, arrival="TIMESTAMP '2024-01-01' + INTERVAL (i) SECOND",
        finish="TIMESTAMP '2024-01-01' + INTERVAL ([3, 2, 5][i + 1]) SECOND")  # fmt: skip
    rows = "SELECT line, arrival_ts, finish_ts FROM requests"
    counts = con.execute(
        f"SELECT line, c FROM ({concurrency.overlap_counts_sql(rows, 'finish_ts', 'line')})"
        " ORDER BY line"
    ).fetchall()
    assert counts == [(0, 1), (1, 2), (2, 2)]


def test_band_labels_and_flags():
    edges = [512, 2048, 8192]
    assert band_label(edges, {0}) == "<512"
    assert band_label(edges, {1, 2}) == "512-8192"
    assert band_label(edges, {3}) == ">=8192"
    assert band_label(edges, {0, 1, 2, 3}) == "any"
    assert band_label(edges, {-1, 0}) == "<512 or unknown"
    assert parse_edges("--prompt-bands", "512, 2048,8192") == [512, 2048, 8192]
    with pytest.raises(BadInput, match="--prompt-bands"):
        parse_edges("--prompt-bands", "512,abc")
    with pytest.raises(BadInput, match="increasing"):
        parse_edges("--output-bands", "128,32")
    with pytest.raises(ValueError):
        Bands(prompt=[10, 5])
