"""Spec-Bench prompts (Xia et al., "Unlocking Efficiency in Large Language Model Inference: A
Comprehensive Survey of Speculative Decoding", Findings of ACL 2024;
github.com/hemingkx/Spec-Bench), data/spec_bench/question.jsonl:
`{"question_id", "category", "turns": [prompt, ...]}`.

Labelled prompts without outputs: one request per turn, task = category, output_tokens NULL.
Prompt tokens are ESTIMATED from the text (about 4 characters per token): the turns so far,
without the model's earlier answers, which the file does not hold.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample
from collectors.normalize import estimated_tokens


def detect(sample: Sample) -> bool:
    record = sample.first_record or {}
    return (
        sample.kind == "jsonl"
        and sample.has_columns("question_id", "category")
        and isinstance(record.get("turns"), list)
    )


def select(options: Options) -> str:
    return f"""
        WITH q AS (
            SELECT line, raw, f[1] AS question_id, f[2] AS category,
                   try(json_extract_string(raw, '$.turns[*]')) AS turns
            FROM (
                SELECT line, raw,
                       try(json_extract_string(raw, ['$.question_id', '$.category'])) AS f
                FROM src
            )
        ),
        turn AS (
            SELECT line, question_id, category, i,
                   string_agg(said, chr(10) || chr(10))
                       OVER (PARTITION BY line ORDER BY i ROWS UNBOUNDED PRECEDING) AS so_far
            FROM (
                SELECT line, question_id, category,
                       unnest(range(1, len(turns) + 1)) AS i, unnest(turns) AS said
                FROM q
            )
        )
        SELECT t.line, q.raw, coalesce(t.question_id, CAST(t.line AS VARCHAR)) || '#' || t.i
                   AS request_id,
               t.category AS task, {estimated_tokens("t.so_far")} AS prompt_tokens,
               t.so_far AS prompt_text, NULL AS reject_reason
        FROM turn t JOIN q USING (line)
        UNION ALL
        SELECT line, raw, NULL, NULL, NULL, NULL, 'turns is missing or empty (expected a list of'
               || ' prompt strings)'
        FROM q WHERE turns IS NULL OR len(turns) = 0
    """


COLLECTOR = Collector(
    name="specbench",
    summary="Spec-Bench question.jsonl: labelled prompts (task = category), no outputs; prompt "
    "tokens ESTIMATED from text (~4 chars/token)",
    expects="JSON lines with question_id, category, turns",
    reader="jsonl",
    detect=detect,
    select=select,
    required=("prompt_tokens",),
)
