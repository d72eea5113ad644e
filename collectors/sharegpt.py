"""ShareGPT conversations (the JSON array that vLLM's and others' serving benchmarks replay):
`[{"id": ..., "conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}]`.

One request per human turn answered by the next turn: its prompt is the conversation so far
(what a chat server receives), its output the answer. ShareGPT has no token counts, timestamps
or sampling settings: the token counts here are ESTIMATES from the text length (about 4
characters per token for English, see normalize.CHARS_PER_TOKEN; CJK text is undercounted), not
a tokenizer's counts. Task: "chat".
A conversation with no answered human turn is rejected with that reason.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample
from collectors.normalize import estimated_tokens

HUMAN = ("human", "user")
ASSISTANT = ("gpt", "chatgpt", "bard", "bing", "assistant", "model")


def detect(sample: Sample) -> bool:
    record = sample.first_record or {}
    return sample.kind in ("json_array", "jsonl") and isinstance(record.get("conversations"), list)


def _in(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def select(options: Options) -> str:
    return f"""
        WITH conv AS (
            SELECT line, CAST(raw AS VARCHAR) AS raw,
                   coalesce(try(json_extract_string(raw, '$.id')), CAST(line AS VARCHAR))
                       AS conv_id,
                   try(json_extract(raw, '$.conversations[*]')) AS turns
            FROM src
        ),
        turn AS (
            SELECT line, conv_id, i, t[1] AS who, t[2] AS said FROM (
                SELECT line, conv_id, unnest(range(1, len(turns) + 1)) AS i,
                       json_extract_string(unnest(turns), ['$.from', '$.value']) AS t
                FROM conv
            )
        ),
        history AS (
            SELECT *, lead(who) OVER w AS next_who, lead(said) OVER w AS answer,
                   string_agg(said, chr(10) || chr(10)) OVER (w ROWS UNBOUNDED PRECEDING)
                       AS so_far
            FROM turn
            WINDOW w AS (PARTITION BY line ORDER BY i)
        ),
        pairs AS (
            SELECT line, conv_id || '#' || i AS request_id, so_far AS prompt_text,
                   answer AS output_text
            FROM history
            WHERE lower(who) IN {_in(HUMAN)} AND lower(next_who) IN {_in(ASSISTANT)}
        )
        SELECT p.line, c.raw, p.request_id, 'chat' AS task,
               {estimated_tokens("p.prompt_text")} AS prompt_tokens,
               {estimated_tokens("p.output_text")} AS output_tokens,
               p.prompt_text, p.output_text, NULL AS reject_reason
        FROM pairs p JOIN conv c USING (line)
        UNION ALL
        SELECT line, raw, NULL, NULL, NULL, NULL, NULL, NULL,
               CASE WHEN turns IS NULL OR len(turns) = 0 THEN 'conversations is missing or empty'
                    ELSE 'no human turn followed by an answer' END
        FROM conv WHERE line NOT IN (SELECT line FROM pairs)
    """


COLLECTOR = Collector(
    name="sharegpt",
    summary="ShareGPT conversations JSON: one request per answered human turn; token counts "
    "ESTIMATED from text (~4 chars/token), task 'chat'",
    expects='a JSON array of {"id", "conversations": [{"from", "value"}]}',
    reader="json_array",
    readers=("json_array", "jsonl"),
    detect=detect,
    select=select,
)
