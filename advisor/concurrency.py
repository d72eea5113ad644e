"""Concurrency per request: requests in flight when it arrived, itself included.

Three sources, in order of preference, recorded in `concurrency_source`:
- 'log': the log gave it;
- 'derived': counted from logged arrival and finish times (`overlap_counts_sql` with the
  logged finish; collectors.ingest does this at import time);
- 'estimated': only arrivals are logged (Azure, Mooncake, BurstGPT), so each request's finish is
  its arrival plus the service time the performance model predicts for it at the batch it meets;
  since that batch is itself the concurrency, the count is iterated (`estimate`).
Requests with no arrival time at all cannot overlap anything we know of: 'assumed' 1.

Every count is an overlap count in DuckDB SQL; Python only evaluates the service-time model on
the distinct (prompt, output, batch) buckets, never per row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from advisor.segments import SCOPE
from advisor.store import one

ServiceTime = Callable[[float, float, float], float]
"""Seconds one request with (prompt tokens, output tokens) spends in a server running `batch`."""

# Requests beyond the engine's running-batch limit queue instead of widening the batch;
# 256 is vLLM's --max-num-seqs default (vllm/engine/arg_utils.py, EngineArgs.max_num_seqs).
MAX_BATCH = 256
_STEPS_PER_OCTAVE = 4  # service-time buckets are 2^(1/4) apart: within +-9% of every request
_BIN_US = 10_000  # estimated counts bin events to 10 ms; exact counts use the full sweep


def overlap_counts_sql(rows_sql: str, finish_expr: str, key: str, bin_us: int | None = None) -> str:
    """SELECT `key`, c: requests in flight at each arrival, the request itself included.

    `rows_sql` yields `key`, `arrival_ts` and whatever `finish_expr` (a TIMESTAMP expression)
    reads. With `bin_us` None the count is exact: a sweep over arrival and finish events in which
    finishes sort before arrivals at the same instant, so a request that ends as another starts
    does not overlap it. With `bin_us` the events are counted per bin of that many microseconds
    (a hash aggregation instead of a sort of every event, several times faster on millions of
    rows); a request then sees the load at the end of its arrival's bin, off by at most the
    events inside one bin.
    """
    if bin_us is None:
        return f"""
            WITH r AS ({rows_sql}),
            ev AS (
                SELECT {key} AS k, arrival_ts AS ts, 1 AS delta, 1 AS is_arrival FROM r
                UNION ALL
                SELECT NULL, {finish_expr}, -1, 0 FROM r
            )
            SELECT k AS {key}, sum(delta) OVER (ORDER BY ts, is_arrival, k
                                               ROWS UNBOUNDED PRECEDING) AS c
            FROM ev QUALIFY is_arrival = 1
        """
    return f"""
        WITH r AS ({rows_sql}),
        ev AS (
            SELECT epoch_us(arrival_ts) // {bin_us} AS b, 1 AS delta FROM r
            UNION ALL
            SELECT epoch_us({finish_expr}) // {bin_us}, -1 FROM r
        ),
        per_bin AS (SELECT b, sum(delta) AS d FROM ev GROUP BY b),
        running AS (SELECT b, sum(d) OVER (ORDER BY b) AS c FROM per_bin)
        SELECT r.{key}, greatest(running.c, 1)::INTEGER AS c
        FROM r JOIN running ON running.b = epoch_us(r.arrival_ts) // {bin_us}
    """


def derive_from_finish(con: duckdb.DuckDBPyConnection, import_id: int) -> None:
    """Fill `requests.concurrency` ('derived') for one import's rows with arrival and finish.

    Rows whose log gave concurrency keep it. This is the SQL collectors.ingest runs per import.
    """
    rows = (
        "SELECT line, arrival_ts, finish_ts FROM requests"
        f" WHERE import_id = {int(import_id)} AND arrival_ts IS NOT NULL"
        " AND finish_ts IS NOT NULL"
    )
    con.execute(
        f"""
        UPDATE requests SET concurrency = d.c, concurrency_source = 'derived'
        FROM ({overlap_counts_sql(rows, "finish_ts", "line")}) d
        WHERE requests.import_id = {int(import_id)} AND requests.line = d.line
          AND requests.concurrency IS NULL
        """
    )


@dataclass(frozen=True)
class ConcurrencyInfo:
    """How the scoped requests' concurrency was obtained (counts of requests)."""

    logged: int
    derived: int
    estimated: int
    assumed: int
    iterations: int

    @property
    def was_estimated(self) -> bool:
        return self.estimated > 0 or self.assumed > 0


def fill(
    con: duckdb.DuckDBPyConnection, service_s: ServiceTime, iterations: int = 2
) -> ConcurrencyInfo:
    """Give every row of `advisor_scope` a concurrency, estimating it where the log cannot."""
    missing, with_arrival = one(
        con,
        f"SELECT count(*) FILTER (WHERE concurrency IS NULL),"
        f" count(*) FILTER (WHERE concurrency IS NULL AND arrival_ts IS NOT NULL) FROM {SCOPE}",
    )
    done = 0
    if with_arrival:
        estimate(con, service_s, iterations)
        done = iterations
    if missing > with_arrival:
        con.execute(
            f"UPDATE {SCOPE} SET concurrency = 1, concurrency_source = 'assumed'"
            " WHERE concurrency IS NULL"
        )
    counts = dict(
        con.execute(f"SELECT concurrency_source, count(*) FROM {SCOPE} GROUP BY ALL").fetchall()
    )
    return ConcurrencyInfo(
        logged=counts.get("log", 0),
        derived=counts.get("derived", 0),
        estimated=counts.get("estimated", 0),
        assumed=counts.get("assumed", 0),
        iterations=done,
    )


def estimate(con: duckdb.DuckDBPyConnection, service_s: ServiceTime, iterations: int = 2) -> None:
    """Estimate concurrency for scoped rows that have an arrival but no concurrency.

    Start from batch 1; each iteration predicts every request's service time at the batch the
    previous count gave it, sets its finish to arrival + that time (a logged finish wins), and
    recounts the overlaps over all scoped arrivals. Two iterations settle all but overloaded
    traces, where the count keeps growing and the reasons will say the GPU is saturated anyway.
    """
    con.execute(
        f"UPDATE {SCOPE} SET concurrency_source = 'estimated'"
        " WHERE concurrency IS NULL AND arrival_ts IS NOT NULL"
    )
    batch = "1"
    for _ in range(max(iterations, 1)):
        _service_times(con, service_s, batch)
        finish = (
            "coalesce(finish_ts, arrival_ts + to_microseconds(us))"
            if _has_logged_finish(con)
            else "arrival_ts + to_microseconds(us)"
        )
        rows = (
            f"SELECT s.rid, s.arrival_ts, s.finish_ts, lat.us FROM {SCOPE} s"
            " JOIN advisor_latency lat ON lat.pb = " + _bucket("s.prompt_tokens") + " AND lat.ob = "
            f"{_bucket('s.output_tokens')} AND lat.cb = {_bucket(batch, cap=True)}"
            " WHERE s.arrival_ts IS NOT NULL"
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE advisor_overlap AS "
            + overlap_counts_sql(rows, finish, "rid", bin_us=_BIN_US)
        )
        con.execute(
            f"UPDATE {SCOPE} SET concurrency = o.c FROM advisor_overlap o"
            f" WHERE {SCOPE}.rid = o.rid AND {SCOPE}.concurrency_source = 'estimated'"
        )
        batch = "s.concurrency"
    con.execute("DROP TABLE IF EXISTS advisor_overlap")


def _has_logged_finish(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(one(con, f"SELECT count(*) FROM {SCOPE} WHERE finish_ts IS NOT NULL")[0])


def _bucket(expr: str, cap: bool = False) -> str:
    """Log-spaced bucket index of a positive count: round(4 log2 x)."""
    value = f"least(greatest({expr}, 1), {MAX_BATCH})" if cap else f"greatest({expr}, 1)"
    return f"round({_STEPS_PER_OCTAVE} * log2({value}))::INTEGER"


def _service_times(con: duckdb.DuckDBPyConnection, service_s: ServiceTime, batch: str) -> None:
    """Table advisor_latency(pb, ob, cb, us): the model's service time per distinct bucket."""
    keys = con.execute(
        f"SELECT DISTINCT {_bucket('s.prompt_tokens')}, {_bucket('s.output_tokens')},"
        f" {_bucket(batch, cap=True)} FROM {SCOPE} s WHERE s.arrival_ts IS NOT NULL"
    ).fetchall()
    micros = [max(1, round(1e6 * service_s(_value(p), _value(o), _value(c)))) for p, o, c in keys]
    con.execute(
        "CREATE OR REPLACE TEMP TABLE advisor_latency AS SELECT unnest($p) AS pb,"
        " unnest($o) AS ob, unnest($c) AS cb, unnest($us)::BIGINT AS us",
        {
            "p": [k[0] for k in keys],
            "o": [k[1] for k in keys],
            "c": [k[2] for k in keys],
            "us": micros,
        },
    )


def _value(bucket: int) -> float:
    """The count a bucket stands for (its geometric centre)."""
    return math.pow(2.0, bucket / _STEPS_PER_OCTAVE)
