"""A prompt bank the project writes itself, and prompts of a requested token length from it.

When a log has no prompt text, calibration still needs prompts whose *content* fits the task:
speculative acceptance depends on it (structured output that copies its input drafts well,
open-ended writing does not). Each bank category builds an instruction plus material (records,
a schema, code, a premise, a document, a conversation) that grows until the prompt has the
requested number of tokens. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

Category = Literal[
    "json",
    "sql",
    "code_edit",
    "story",
    "poem",
    "brainstorm",
    "document_qa",
    "summarize",
    "chat",
]
CATEGORIES: tuple[Category, ...] = (
    "json",
    "sql",
    "code_edit",
    "story",
    "poem",
    "brainstorm",
    "document_qa",
    "summarize",
    "chat",
)
TokenCounter = Callable[[str], int]

# Task labels seen in logs and benchmarks (Spec-Bench categories, ShareGPT/OpenAI-log labels,
# the advisor's own names) -> bank categories. Matching is by substring, first hit wins.
_TASK_WORDS: tuple[tuple[str, Category], ...] = (
    ("json", "json"),
    ("extract", "json"),
    ("struct", "json"),
    ("function", "json"),
    ("tool", "json"),
    ("sql", "sql"),
    ("code", "code_edit"),
    ("coding", "code_edit"),
    ("program", "code_edit"),
    ("edit", "code_edit"),
    ("rewrite", "code_edit"),
    ("story", "story"),
    ("creative", "story"),
    ("writing", "story"),
    ("roleplay", "story"),
    ("poem", "poem"),
    ("poetry", "poem"),
    ("brainstorm", "brainstorm"),
    ("idea", "brainstorm"),
    ("summar", "summarize"),
    ("rag", "document_qa"),
    ("retriev", "document_qa"),
    ("qa", "document_qa"),
    ("question", "document_qa"),
    ("long", "document_qa"),
    ("document", "document_qa"),
    ("math", "chat"),
    ("reason", "chat"),
    ("translat", "chat"),
    ("chat", "chat"),
    ("conversation", "chat"),
)

_NAMES = ["Ada", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal"]
_CITIES = ["Lisbon", "Osaka", "Nairobi", "Quito", "Tallinn", "Perth", "Lyon", "Pune", "Bergen"]
_ITEMS = ["lamp", "kettle", "bicycle", "notebook", "drill", "tent", "camera", "chair", "guitar"]
_ADJ = ["quiet", "amber", "restless", "hollow", "silver", "tangled", "distant", "bright", "salt"]
_NOUNS = ["harbour", "lantern", "orchard", "archive", "bridge", "glacier", "market", "tower"]
_VERBS = ["remembers", "follows", "mends", "hides", "carries", "questions", "wakes", "loses"]
_TOPICS = [
    "a night train",
    "an abandoned lighthouse",
    "a city garden",
    "the first snow",
    "a lost letter",
    "a clockmaker's shop",
    "a desert radio station",
    "a flooded library",
]


def category_for(task: str | None) -> Category:
    """Bank category for a logged task label; unlabelled or unknown labels are chat."""
    if not task:
        return "chat"
    label = task.lower()
    if label in CATEGORIES:
        return label  # type: ignore[return-value]
    for word, category in _TASK_WORDS:
        if word in label:
            return category
    return "chat"


def approx_tokens(text: str) -> int:
    """About 4 characters per token for English BPE vocabularies; used without a tokenizer."""
    return max(1, round(len(text) / 4))


# --- material generators: one unit of filler per call, content typical of the category ---


def _record(rng: random.Random, i: int) -> str:
    return (
        f'  {{"id": {1000 + i}, "customer": "{rng.choice(_NAMES)} {rng.choice(_NAMES)}son",'
        f' "city": "{rng.choice(_CITIES)}", "item": "{rng.choice(_ITEMS)}",'
        f' "qty": {rng.randint(1, 9)}, "price": {rng.randint(5, 400)}.{rng.randint(0, 99):02d},'
        f' "paid": {rng.choice(["true", "false"])}}},\n'
    )


def _sql_row(rng: random.Random, i: int) -> str:
    return (
        f"INSERT INTO orders VALUES ({i}, '{rng.choice(_NAMES)}', '{rng.choice(_CITIES)}',"
        f" '{rng.choice(_ITEMS)}', {rng.randint(1, 9)},"
        f" {rng.randint(5, 400)}.{rng.randint(0, 99):02d});\n"
    )


def _code_fn(rng: random.Random, i: int) -> str:
    item = rng.choice(_ITEMS)
    verb = rng.choice(["total", "count", "audit", "collect", "price"])
    field = rng.choice(["qty", "weight", "discount", "units"])
    return (
        f"def {verb}_{item}_{i}(orders, limit={rng.randint(1, 99)}):\n"
        f"    result = 0\n"
        f"    for order in orders:\n"
        f"        if order['item'] == '{item}' and order['{field}'] > {rng.randint(0, 9)}:\n"
        f"            result += order['{field}'] * order['price']\n"
        f"    return min(result, limit)\n\n"
    )


def _sentence(rng: random.Random, i: int) -> str:
    return f"{rng.choice(_ADJ)} {rng.choice(_NOUNS)}, "


def _fact(rng: random.Random, i: int) -> str:
    return (
        f"In {1900 + rng.randint(0, 120)}, the {rng.choice(_CITIES)} branch of Northwind"
        f" Cooperative hired {rng.randint(2, 300)} people and sold {rng.randint(10, 9000)}"
        f" {rng.choice(_ITEMS)}s;"
        f" its manager, {rng.choice(_NAMES)}, opened a {rng.choice(_NOUNS)} beside the river. "
    )


def _chat_turn(rng: random.Random, i: int) -> str:
    name = rng.choice(_NAMES)
    return (
        f"User: My friend {name} is visiting {rng.choice(_CITIES)} and wants to buy a "
        f"{rng.choice(_ITEMS)}. What should they look for?\n"
        f"Assistant: {name} should compare a few shops, check the warranty, and ask whether the "
        f"{rng.choice(_ITEMS)} can be returned.\n"
    )


_BANK: dict[Category, tuple[str, Callable[[random.Random, int], str], str, str]] = {
    # category: (instruction, filler unit, material header, closing)
    "json": (
        "Return the JSON array below unchanged, except that every object gets one more key,"
        ' "currency": "EUR", after "price". Output only the JSON.',
        _record,
        "[\n",
        "]",
    ),
    "sql": (
        "Rewrite the SQL below so that every INSERT goes into the table orders_2024 instead of"
        " orders, keeping all values unchanged; then add a query for total revenue per city.",
        _sql_row,
        "```sql\n",
        "```",
    ),
    "code_edit": (
        "Rewrite the Python module below: rename the parameter `orders` to `purchases`"
        " everywhere and return the complete updated module, otherwise unchanged.",
        _code_fn,
        "```python\n",
        "```",
    ),
    "story": (
        "Write a long, original story about {topic}. Invent the characters, give them voices,"
        " and end with a surprise. Images you may borrow from:",
        _sentence,
        "\n",
        "\n",
    ),
    "poem": (
        "Write a free-verse poem about {topic}, with vivid, unexpected imagery. Moods to draw on:",
        _sentence,
        "\n",
        "\n",
    ),
    "brainstorm": (
        "Brainstorm many different, unusual ideas for a small business built around {topic}."
        " Give each idea a name and a one-line pitch. Themes to mix:",
        _sentence,
        "\n",
        "\n",
    ),
    "document_qa": (
        "Read the company history below and answer: which branch hired the most people, and who"
        " managed it? Quote the sentence you relied on.",
        _fact,
        "Document:\n",
        "\nAnswer:",
    ),
    "summarize": (
        "Summarise the company history below in a few paragraphs, keeping the key numbers.",
        _fact,
        "Document:\n",
        "\nSummary:",
    ),
    "chat": (
        "The following is a conversation between a user and a helpful assistant.",
        _chat_turn,
        "\n",
        "User: Thanks! One more question: what is a good way to plan the rest of the trip?\n"
        "Assistant:",
    ),
}


def synthesize(
    category: Category,
    target_tokens: int,
    *,
    seed: int = 0,
    count_tokens: TokenCounter = approx_tokens,
) -> str:
    """A prompt of about `target_tokens` tokens (by `count_tokens`) whose content fits the
    category: the instruction and closing stay, filler units are added until the length is
    reached (never overshooting by more than one unit)."""
    rng = random.Random(f"{category}:{seed}")
    instruction, unit, header, closing = _BANK[category]
    instruction = instruction.format(topic=rng.choice(_TOPICS))
    fixed = f"{instruction}\n{header}{{}}{closing}"
    units: list[str] = []

    def length(n: int) -> int:
        while len(units) < n:
            units.append(unit(rng, len(units)))
        return count_tokens(fixed.format("".join(units[:n])))

    # The smallest unit count reaching the target: doubling, then bisection, so a tokenizer
    # round trip is needed only O(log n) times.
    hi = 1
    while length(hi) < target_tokens:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if length(mid) >= target_tokens:
            hi = mid
        else:
            lo = mid
    n = max(1, hi if length(lo) < target_tokens else lo)  # at least one unit of material
    del units[n:]
    return fixed.format("".join(units))


def prompt_for(
    task: str | None,
    target_tokens: int,
    *,
    logged_text: str | None = None,
    seed: int = 0,
    count_tokens: TokenCounter = approx_tokens,
) -> tuple[str, Literal["logged", "synthesized"]]:
    """Logged text when there is some, else a synthesized prompt fitting the task label."""
    if logged_text:
        return logged_text, "logged"
    return synthesize(category_for(task), target_tokens, seed=seed, count_tokens=count_tokens), (
        "synthesized"
    )
