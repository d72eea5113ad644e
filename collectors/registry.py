"""The one place formats are registered. Detection tries them in this order: specific first."""

from __future__ import annotations

from advisor.errors import BadInput
from collectors import (
    azure,
    burstgpt,
    generic,
    helicone,
    langfuse,
    litellm,
    mooncake,
    openai_logs,
    sharegpt,
    specbench,
    vllm_log,
)
from collectors.base import Collector

COLLECTORS: tuple[Collector, ...] = (
    litellm.PAYLOAD,
    litellm.SPEND_LOGS,
    langfuse.COLLECTOR,
    helicone.COLLECTOR,
    vllm_log.COLLECTOR,
    openai_logs.COLLECTOR,
    azure.COLLECTOR,
    burstgpt.COLLECTOR,
    mooncake.COLLECTOR,
    sharegpt.COLLECTOR,
    specbench.COLLECTOR,
    generic.COLLECTOR,
)


def by_name(name: str) -> Collector:
    """The collector called `name`, or BadInput naming the valid ones."""
    for collector in COLLECTORS:
        if collector.name == name:
            return collector
    valid = ", ".join(c.name for c in COLLECTORS)
    raise BadInput(f"Unknown format '{name}'; valid formats: {valid}.")
