"""Concurrency per request: requests in flight when it arrived, itself included.

Three sources, in order of preference, recorded in `concurrency_source`:
- 'log': the log gave it;
- 'derived': counted from logged arrival and finish times (`overlap_counts_sql` with the
  logged finish; collectors.ingest runs it at import time);
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

from advisor.segments import ROWS, SCOPE
from advisor.store import one

ServiceTime = Callable[[float, float, float], float]
"""Seconds one request with (prompt tokens, output tokens) spends in a server running `batch`."""

# Requests beyond the engine's running-batch limit (vLLM --max-num-seqs) queue instead of
# widening the batch. vLLM's default depends on the GPU (vllm/engine/arg_utils.py,
# EngineArgs.get_batch_defaults): 1024 on GPUs with >= 70 GiB other than the A100, else 256.
MAX_BATCH = 256
_STEPS_PER_OCTAVE = 4  # service-time buckets are 2^(1/4) apart: within +-9% of every request
BIN_US = 10_000  # estimated counts bin events to 10 ms; exact counts use the full sweep
WINDOW_US = 100_000  # the batch a request meets: the mean in-flight count over 100 ms


def overlap_counts_sql(rows_sql: str, finish_expr: str, key: str) -> str:
    """SELECT `key`, c: requests in flight at each arrival, the request itself included.

    `rows_sql` yields `key`, `arrival_ts` and whatever `finish_expr` (a TIMESTAMP expression)
    reads. A sweep over arrival and finish events in which finishes sort before arrivals at the
    same instant, so a request that ends as another starts does not overlap it.
    """
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


@dataclass(frozen=True)
class ConcurrencyInfo:
    """How the scoped requests' concurrency was obtained (counts of requests)."""

    logged: int
    derived: int
    estimated: int
    assumed: int
    iterations: int
    max_batch: int = MAX_BATCH

    @property
    def was_estimated(self) -> bool:
        return self.estimated > 0 or self.assumed > 0


def fill(
    con: duckdb.DuckDBPyConnection,
    service_s: ServiceTime,
    iterations: int = 2,
    max_batch: int = MAX_BATCH,
) -> ConcurrencyInfo:
    """Give every row of `advisor_scope` a concurrency: the view `advisor_rows`."""
    logged, derived, estimated, assumed = one(
        con,
        "SELECT count(*) FILTER (WHERE concurrency IS NOT NULL AND concurrency_source = 'log'),"
        " count(*) FILTER (WHERE concurrency IS NOT NULL AND concurrency_source <> 'log'),"
        " count(*) FILTER (WHERE concurrency IS NULL AND arrival_us IS NOT NULL),"
        f" count(*) FILTER (WHERE concurrency IS NULL AND arrival_us IS NULL) FROM {SCOPE}",
    )
    if estimated:
        estimate(con, service_s, iterations, max_batch)
        c = "greatest(bins.c, 1)"
        join = (
            "LEFT JOIN advisor_bins bins"
            f" ON bins.model = s.model AND bins.b = s.arrival_us // {BIN_US}"
        )
    else:
        c, join = "NULL", ""
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW {ROWS} AS SELECT s.* REPLACE ("
        f" coalesce(s.concurrency, {c}, 1)::INTEGER AS concurrency,"
        " CASE WHEN s.concurrency IS NOT NULL THEN s.concurrency_source"
        " WHEN s.arrival_us IS NOT NULL THEN 'estimated' ELSE 'assumed' END"
        f" AS concurrency_source) FROM {SCOPE} s {join}"
    )
    return ConcurrencyInfo(
        logged=logged,
        derived=derived,
        estimated=estimated,
        assumed=assumed,
        iterations=max(iterations, 1) if estimated else 0,
        max_batch=max_batch,
    )


def estimate(
    con: duckdb.DuckDBPyConnection,
    service_s: ServiceTime,
    iterations: int = 2,
    max_batch: int = MAX_BATCH,
) -> None:
    """`advisor_bins(model, b, c)`: requests in flight at the end of each 10 ms bin b, per
    model (requests for different models run on different servers and share no batch).

    Start from batch 1 (or the logged concurrency); each iteration predicts every request's
    service time at the batch the previous count gave it (the mean over its 100 ms window), sets
    its finish to arrival + that time (a logged finish wins), and recounts. Two iterations settle
    all but overloaded traces, where the count keeps growing and the reasons say the GPU is
    saturated anyway.

    Counting per bin (arrivals minus finishes, then a running sum over the bins) is hash
    aggregation instead of a sort of every arrival and finish event, several times faster on
    millions of rows; a request then sees the load at the end of its arrival's bin, off by at
    most the events inside one bin. Arrivals per bin are counted once; each iteration only
    re-counts the predicted finishes.
    """
    per_window = WINDOW_US // BIN_US
    con.execute(
        "CREATE OR REPLACE TEMP TABLE advisor_est AS SELECT model, arrival_us, finish_us,"
        f" concurrency AS logged, {_bucket('prompt_tokens')}::SMALLINT AS pb,"
        f" {_bucket('output_tokens')}::SMALLINT AS ob, arrival_us // {WINDOW_US} AS w"
        f" FROM {SCOPE} WHERE arrival_us IS NOT NULL"
    )
    con.execute(
        "CREATE OR REPLACE TEMP TABLE advisor_arrivals AS"
        f" SELECT model, arrival_us // {BIN_US} AS b, count(*) AS n FROM advisor_est"
        " GROUP BY model, b"
    )
    batch, prev = "coalesce(e.logged, 1)", ""
    for _ in range(max(iterations, 1)):
        cb = _bucket(batch, cap=max_batch)
        _service_times(con, service_s, f"SELECT DISTINCT pb, ob, {cb} FROM advisor_est e {prev}")
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE advisor_bins AS
            WITH finishes AS (
                SELECT e.model, coalesce(e.finish_us, e.arrival_us + lat.us) // {BIN_US} AS b,
                       -count(*) AS n
                FROM advisor_est e {prev} JOIN advisor_latency lat
                  ON lat.pb = e.pb AND lat.ob = e.ob AND lat.cb = {cb}
                GROUP BY e.model, b
            ),
            per_bin AS (
                SELECT model, b, sum(n) AS d
                FROM (FROM advisor_arrivals UNION ALL FROM finishes) GROUP BY model, b
            )
            SELECT model, b, sum(d) OVER (PARTITION BY model ORDER BY b) AS c FROM per_bin
            """
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE advisor_batch AS SELECT"
            f" model, b // {per_window} AS w, greatest(avg(c), 1) AS c FROM advisor_bins"
            " GROUP BY model, w"
        )
        batch, prev = "coalesce(e.logged, bt.c)", "JOIN advisor_batch bt USING (model, w)"
    con.execute(
        "DROP TABLE advisor_latency; DROP TABLE advisor_batch; DROP TABLE advisor_est;"
        " DROP TABLE advisor_arrivals"
    )


def _bucket(expr: str, cap: int | None = None) -> str:
    """Log-spaced bucket index of a positive count: round(4 log2 x)."""
    value = f"least(greatest({expr}, 1), {int(cap)})" if cap else f"greatest({expr}, 1)"
    return f"round({_STEPS_PER_OCTAVE} * log2({value}))::INTEGER"


def _service_times(con: duckdb.DuckDBPyConnection, service_s: ServiceTime, keys_sql: str) -> None:
    """Table advisor_latency(pb, ob, cb, us): the model's service time per distinct bucket, so
    Python evaluates the model a few thousand times, never once per row."""
    keys = con.execute(keys_sql).fetchall()
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
