"""Workload segmentation: requests that should get the same answer, grouped in DuckDB SQL.

A segment is task label x temperature band x prompt-length band x output-length band x
concurrency band (DESIGN.md, "The decision model"). Band assignment, counting and percentiles run
in SQL over the scoped requests: the temp table `advisor_scope` (built by `create_scope`), seen
through the view `advisor_rows` that advisor.concurrency.fill adds every request's concurrency
to. Only the small table of non-empty cells comes to Python, where cells under the minimum share
merge into their nearest neighbour: the same task first, then the fewest band steps away, then
the larger neighbour. Every scoped request lands in exactly one
segment, so the shares sum to 1.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

import duckdb
from pydantic import BaseModel, Field, field_validator

from advisor.errors import BadInput
from advisor.schemas import SegmentStats
from advisor.store import one

SCOPE = "advisor_scope"
ROWS = "advisor_rows"  # SCOPE with concurrency filled in (advisor.concurrency.fill)
UNLABELLED = "unlabelled"
Cell = tuple[str, int, int, int, int]  # task and the four band indices
_DIMS = ("temperature", "prompt", "output", "concurrency")


class Bands(BaseModel):
    """Band edges (each band is [edge_i, edge_i+1)) and the minimum share a segment must hold."""

    prompt: list[float] = Field(default=[512, 2048, 8192], description="prompt tokens")
    output: list[float] = Field(default=[32, 128, 512], description="output tokens")
    temperature: list[float] = Field(
        default=[0.3, 0.8], description="sampling temperature; unlogged temperature is 'unknown'"
    )
    concurrency: list[float] = Field(
        default=[4, 16, 64], description="requests in flight at arrival, the request included"
    )
    min_share: float = Field(default=0.02, ge=0.0, le=0.5)

    @field_validator("prompt", "output", "temperature", "concurrency")
    @classmethod
    def _increasing(cls, edges: list[float]) -> list[float]:
        if any(e < 0 for e in edges) or any(b <= a for a, b in pairwise(edges)):
            raise ValueError(f"band edges must be non-negative and increasing, got {edges}")
        return edges


def parse_edges(flag: str, text: str) -> list[float]:
    """`--prompt-bands 512,2048,8192` -> [512.0, 2048.0, 8192.0], or BadInput naming the flag."""
    try:
        edges = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(
            f"{flag} {text!r} is not a list of numbers; expected e.g. {flag} 512,2048,8192."
        ) from None
    if any(e < 0 for e in edges) or any(b <= a for a, b in pairwise(edges)):
        raise BadInput(f"{flag} {text!r} must be non-negative and increasing, e.g. 512,2048,8192.")
    return edges


class Filters(BaseModel):
    """Which logged requests a recommendation covers."""

    import_ids: list[int] = []
    since: datetime | None = None
    until: datetime | None = None
    model: str | None = None
    tenant: str | None = None

    def where(self) -> tuple[str, list[object]]:
        """SQL conditions on `requests` and their parameters."""
        conds, params = ["output_tokens IS NOT NULL"], []
        if self.import_ids:
            conds.append(f"import_id IN ({', '.join('?' for _ in self.import_ids)})")
            params += self.import_ids
        if self.since is not None:
            conds.append("arrival_ts >= ?")
            params.append(self.since)
        if self.until is not None:
            conds.append("arrival_ts < ?")
            params.append(self.until)
        if self.model is not None:
            conds.append("model = ?")
            params.append(self.model)
        if self.tenant is not None:
            conds.append("tenant = ?")
            params.append(self.tenant)
        return " AND ".join(conds), params


@dataclass(frozen=True)
class Scope:
    """What the filters selected."""

    n: int
    without_output: int  # matched the filters but have no output token count: left out
    first_arrival: datetime | None
    last_arrival: datetime | None
    models: int = 1  # distinct model names (unnamed counts as one); concurrency is per model

    @property
    def duration_s(self) -> float | None:
        """Seconds between the first and last arrival (None when arrivals are not logged)."""
        if self.first_arrival is None or self.last_arrival is None:
            return None
        return (self.last_arrival - self.first_arrival).total_seconds()


def create_scope(con: duckdb.DuckDBPyConnection, filters: Filters) -> Scope:
    """Copy the filtered requests' few needed columns into the temp table `advisor_scope`."""
    where, params = filters.where()
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {SCOPE} AS"
        " SELECT epoch_us(arrival_ts) AS arrival_us, epoch_us(finish_ts) AS finish_us,"
        " prompt_tokens, output_tokens, temperature, coalesce(task, ?) AS task, concurrency,"
        " concurrency_source, prompt_text IS NOT NULL AS has_text,"
        " coalesce(model, '') AS model"
        f" FROM requests WHERE {where}",
        [UNLABELLED, *params],
    )
    n, first, last, models = one(
        con,
        "SELECT count(*), make_timestamp(min(arrival_us)), make_timestamp(max(arrival_us)),"
        f" count(DISTINCT model) FROM {SCOPE}",
    )
    no_output_where = where.replace("output_tokens IS NOT NULL", "output_tokens IS NULL", 1)
    without = one(con, f"SELECT count(*) FROM requests WHERE {no_output_where}", params)[0]
    if n == 0 and without:
        raise BadInput(
            f"None of the {without:,} matching requests has an output token count "
            f"({_describe(filters)}); the advisor needs output lengths, so import a log that "
            "records them (a prompt-only set such as Spec-Bench questions cannot be scored)."
        )
    if n == 0:
        raise BadInput(
            "No requests match: the database holds none for these filters "
            f"({_describe(filters)}); import a log or widen --since/--until/--model/--tenant."
        )
    return Scope(n=n, without_output=without, first_arrival=first, last_arrival=last, models=models)


def _describe(filters: Filters) -> str:
    given = {k: v for k, v in filters.model_dump().items() if v not in (None, [])}
    return ", ".join(f"{k}={v}" for k, v in given.items()) or "no filters"


def _literal(edge: float) -> str:
    """An integer literal for whole edges (a DECIMAL literal would make DuckDB cast every integer
    column to DECIMAL to compare: several times slower), else a DOUBLE."""
    return str(int(edge)) if float(edge).is_integer() else f"{float(edge)!r}::DOUBLE"


def band_index_sql(column: str, edges: list[float]) -> str:
    """0 below the first edge, i at or above the i-th edge; -1 for NULL."""
    if not edges:
        return f"CASE WHEN {column} IS NULL THEN -1 ELSE 0 END"
    steps = " + ".join(f"({column} >= {_literal(e)})::INTEGER" for e in edges)
    return f"CASE WHEN {column} IS NULL THEN -1 ELSE {steps} END"


def _index_exprs(bands: Bands) -> dict[str, str]:
    return {
        "temperature": band_index_sql("temperature", bands.temperature),
        "prompt": band_index_sql("prompt_tokens", bands.prompt),
        "output": band_index_sql("output_tokens", bands.output),
        "concurrency": band_index_sql("concurrency", bands.concurrency),
    }


def _num(x: float) -> str:
    return f"{x:g}"


def band_label(edges: list[float], indices: set[int]) -> str:
    """A readable label for a set of band indices (merged segments span several)."""
    known = sorted(i for i in indices if i >= 0)
    parts = []
    if known:
        lo, hi = known[0], known[-1]
        if lo == 0 and hi == len(edges):
            parts.append("any")
        elif lo == 0:
            parts.append(f"<{_num(edges[hi])}")
        elif hi == len(edges):
            parts.append(f">={_num(edges[lo - 1])}")
        else:
            parts.append(f"{_num(edges[lo - 1])}-{_num(edges[hi])}")
    if -1 in indices:
        parts.append("unknown")
    return " or ".join(parts)


@dataclass
class _Segment:
    anchor: Cell  # the founding cell
    n: int
    cells: list[Cell] = field(default_factory=list)


def merge_cells(cells: dict[Cell, int], min_share: float) -> list[_Segment]:
    """Merge cells under `min_share` of the total into their nearest neighbour, smallest first.

    Nearest: same task before any other task, then the fewest band steps (L1 over the four band
    indices of the segments' founding cells), then the neighbour with more requests. A heap
    picks the smallest segment and only its own task's segments are searched (all of them only
    when its task has no other), so thousands of cells from many tasks merge in well under a
    second.
    """
    total = sum(cells.values())
    threshold = min_share * total
    segments = [_Segment(anchor=c, n=n, cells=[c]) for c, n in cells.items()]
    alive = [True] * len(segments)
    by_task: dict[str, list[int]] = {}
    for i, seg in enumerate(segments):
        by_task.setdefault(seg.anchor[0], []).append(i)
    heap = [(seg.n, seg.anchor, i) for i, seg in enumerate(segments)]
    heapq.heapify(heap)
    remaining = len(segments)
    while remaining > 1 and heap:
        n, _, i = heapq.heappop(heap)
        small = segments[i]
        if not alive[i] or small.n != n:
            continue  # merged away, or grown since this entry was pushed
        if n >= threshold:
            break
        pool = [j for j in by_task[small.anchor[0]] if j != i] or [
            j for j, ok in enumerate(alive) if ok and j != i
        ]
        t = min(pool, key=lambda j: _merge_cost(small, segments[j]))
        target = segments[t]
        target.n += small.n
        target.cells += small.cells
        alive[i] = False
        by_task[small.anchor[0]].remove(i)
        remaining -= 1
        heapq.heappush(heap, (target.n, target.anchor, t))
    return sorted((s for s, ok in zip(segments, alive, strict=True) if ok),
                  key=lambda s: (-s.n, s.anchor))  # fmt: skip


def _merge_cost(small: _Segment, other: _Segment) -> tuple[int, int, int]:
    a, b = small.anchor, other.anchor
    steps = sum(abs(x - y) for x, y in zip(a[1:], b[1:], strict=True))
    return (a[0] != b[0], steps, -other.n)


def _cell_code_sql(bands: Bands) -> tuple[str, list[int]]:
    """One integer per cell from the four band indices (each shifted by 1 so -1 'unknown' fits):
    grouping and joining on one integer is cheaper than on four expressions."""
    idx = _index_exprs(bands)
    sizes = [len(getattr(bands, d)) + 2 for d in _DIMS]
    code = "0"
    for d, size in zip(_DIMS, sizes, strict=True):
        code = f"({code}) * {size} + ({idx[d]} + 1)"
    return code, sizes


def _decode(code: int, sizes: list[int]) -> tuple[int, ...]:
    out = []
    for size in reversed(sizes):
        code, rem = divmod(code, size)
        out.append(rem - 1)
    return tuple(reversed(out))


def segment(con: duckdb.DuckDBPyConnection, bands: Bands) -> list[SegmentStats]:
    """Segments of `advisor_rows` (the scope with concurrency filled in), largest first."""
    code, sizes = _cell_code_sql(bands)
    rows = con.execute(f"SELECT task, {code} AS cell, count(*) FROM {ROWS} GROUP BY ALL").fetchall()
    cells = {(r[0], *_decode(r[1], sizes)): r[2] for r in rows}
    codes = {(r[0], *_decode(r[1], sizes)): r[1] for r in rows}
    segments = merge_cells(cells, bands.min_share)

    members = [(i, c) for i, s in enumerate(segments) for c in s.cells]
    con.execute(
        "CREATE OR REPLACE TEMP TABLE advisor_segment_map AS SELECT"
        " unnest($seg) AS seg, unnest($task) AS task, unnest($cell) AS cell",
        {
            "seg": [m[0] for m in members],
            "task": [m[1][0] for m in members],
            "cell": [codes[m[1]] for m in members],
        },
    )
    stats = con.execute(
        "SELECT m.seg, count(*),"
        " quantile_cont(prompt_tokens, [0.5, 0.95]), quantile_cont(output_tokens, [0.5, 0.95]),"
        " quantile_cont(temperature, 0.5), quantile_cont(concurrency, [0.5, 0.95]),"
        " bool_or(concurrency_source = 'estimated'), bool_or(has_text),"
        " avg(prompt_tokens), avg(output_tokens)"
        f" FROM {ROWS} s JOIN advisor_segment_map m ON m.task = s.task AND m.cell = {code}"
        " GROUP BY m.seg ORDER BY m.seg"
    ).fetchall()
    total = sum(r[1] for r in stats)
    return [_stats(segments[r[0]], r, total, bands) for r in stats]


def _stats(seg: _Segment, row: tuple, total: int, bands: Bands) -> SegmentStats:
    _, n, prompt_q, output_q, temp_p50, conc_q, estimated, has_text, prompt_mean, output_mean = row
    tasks = sorted({c[0] for c in seg.cells}, key=lambda t: (t != seg.anchor[0], t))
    labels = {
        dim: band_label(getattr(bands, dim), {c[i + 1] for c in seg.cells})
        for i, dim in enumerate(_DIMS)
    }
    task = "+".join(tasks)
    key = (
        f"{task} | temp {labels['temperature']} | prompt {labels['prompt']}"
        f" | out {labels['output']} | conc {labels['concurrency']}"
    )
    return SegmentStats(
        key=key,
        task=task,
        temperature_band=labels["temperature"],
        prompt_band=labels["prompt"],
        output_band=labels["output"],
        concurrency_band=labels["concurrency"],
        n=n,
        share=n / total,
        prompt_p50=prompt_q[0],
        prompt_p95=prompt_q[1],
        output_p50=output_q[0],
        output_p95=output_q[1],
        temperature_p50=temp_p50,
        concurrency_p50=conc_q[0],
        concurrency_p95=conc_q[1],
        concurrency_estimated=bool(estimated),
        has_text=bool(has_text),
        prompt_mean=round(prompt_mean, 2),
        output_mean=round(output_mean, 2),
    )
