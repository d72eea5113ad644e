"""vLLM's speculative-decoding counters from /metrics, and their change over one batch.

Parsed with prometheus_client's text parser: counter families come back without `_total`
whether or not the exposition has it, so both naming styles read the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from calibration.schemas import SpecDecodeDelta

PREFIX = "vllm:spec_decode_"
DRAFTS = PREFIX + "num_drafts"
DRAFT_TOKENS = PREFIX + "num_draft_tokens"
ACCEPTED = PREFIX + "num_accepted_tokens"
ACCEPTED_PER_POS = PREFIX + "num_accepted_tokens_per_pos"


class MetricsError(RuntimeError):
    """/metrics could not be read, or its counters went backwards (the server restarted)."""


@dataclass(frozen=True)
class SpecDecodeCounters:
    """One scrape of the cumulative counters, summed over engines and models."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False  # False when the server exports no spec-decode counters (baseline)


def _base_name(sample_name: str) -> str | None:
    """Counter sample name without `_total`; None for `_created` timestamps."""
    if sample_name.endswith("_created"):
        return None
    return sample_name.removesuffix("_total")


def parse_counters(text: str) -> SpecDecodeCounters:
    """Read the spec-decode counters from a /metrics exposition."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_pos: dict[int, float] = {}
    present = False
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        for sample in family.samples:
            name = _base_name(sample.name)
            if name == ACCEPTED_PER_POS:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
                present = True
            elif name in totals:
                totals[name] += sample.value
                present = True
    return SpecDecodeCounters(
        num_drafts=totals[DRAFTS],
        num_draft_tokens=totals[DRAFT_TOKENS],
        num_accepted_tokens=totals[ACCEPTED],
        accepted_per_pos=per_pos,
        present=present,
    )


def delta(before: SpecDecodeCounters, after: SpecDecodeCounters) -> SpecDecodeDelta | None:
    """Counters' change over a batch; None when the server has no speculation."""
    if not after.present:
        return None
    diffs = {
        "num_drafts": after.num_drafts - before.num_drafts,
        "num_draft_tokens": after.num_draft_tokens - before.num_draft_tokens,
        "num_accepted_tokens": after.num_accepted_tokens - before.num_accepted_tokens,
    }
    k = max(after.accepted_per_pos, default=-1) + 1
    per_pos = [
        after.accepted_per_pos.get(i, 0.0) - before.accepted_per_pos.get(i, 0.0) for i in range(k)
    ]
    if min([*diffs.values(), *per_pos], default=0.0) < 0:
        raise MetricsError(
            "vLLM's spec-decode counters went backwards between two scrapes; "
            "the server restarted during the batch."
        )
    return SpecDecodeDelta(
        num_drafts=round(diffs["num_drafts"]),
        num_draft_tokens=round(diffs["num_draft_tokens"]),
        num_accepted_tokens=round(diffs["num_accepted_tokens"]),
        accepted_per_pos=[round(v) for v in per_pos],
    )


async def scrape(client: httpx.AsyncClient, base_url: str) -> str:
    """GET /metrics as text."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        response = await client.get(url, timeout=30.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise MetricsError(f"could not read {url}: {exc}") from exc
    return response.text


async def scrape_counters(client: httpx.AsyncClient, base_url: str) -> SpecDecodeCounters:
    """Scrape and parse in one call."""
    return parse_counters(await scrape(client, base_url))
