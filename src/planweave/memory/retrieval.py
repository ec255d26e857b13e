"""Retrieval before planning: BM25 over the admitted entries' text, the top k put into the planner prompt.

BM25 is ``rank-bm25``'s ``BM25Okapi`` (the ``[memory]`` extra) with Lucene's non-negative idf,
``log(1 + (N - n + 0.5) / (n + 0.5))``: rank-bm25's own idf goes negative for a term in more than half the entries
(floored at epsilon times the mean idf, itself negative on a memory of one or two entries), which would rank an
entry sharing words with the goal below one sharing none. An entry with no query term in common is never returned.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planweave.extras import require
from planweave.memory.model import MemoryEntry
from planweave.memory.store import MemoryStore

__all__ = ["MemoryRecall", "RecallLimits", "memory_prompt", "rank", "tokenize"]

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(("a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "into", "is", "it",
                   "of", "on", "or", "the", "to", "with", "this", "that"))


def tokenize(text: str) -> list[str]:
    """Lower-case words and digits, without the commonest English words."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def _bm25(corpus: list[list[str]]) -> Any:
    require("memory", "memory retrieval (BM25)")
    from rank_bm25 import BM25Okapi

    class LuceneIdfBM25(BM25Okapi):  # type: ignore[misc]  # rank_bm25 has no type hints
        def _calc_idf(self, nd: dict[str, int]) -> None:
            self.idf = {word: math.log(1.0 + (self.corpus_size - freq + 0.5) / (freq + 0.5))
                        for word, freq in nd.items()}

    return LuceneIdfBM25(corpus)


def rank(query: str, entries: Sequence[MemoryEntry], k: int) -> list[tuple[MemoryEntry, float]]:
    """The at most ``k`` entries that best match ``query`` by BM25, best first (ties: newer entry first)."""
    words = tokenize(query)
    docs = [tokenize(e.search_text()) for e in entries]
    if not entries or not words or k <= 0:
        return []
    scores = _bm25(docs).get_scores(words)
    wanted = set(words)
    scored = [(e, float(s)) for e, s, d in zip(entries, scores, docs, strict=True) if wanted & set(d)]
    scored.sort(key=lambda pair: (-pair[1], -pair[0].id))
    return scored[:k]


@dataclass(frozen=True)
class RecallLimits:
    """How much memory a planner prompt gets: at most ``k`` entries and ``max_chars`` characters in all."""

    k: int = 3
    max_chars: int = 2000


def _entry_text(entry: MemoryEntry) -> str:
    if entry.kind == "lesson":
        return f"- lesson '{entry.name}' (memory {entry.id}): {entry.text}"
    steps = "\n".join("    " + json.dumps(dict(s), separators=(",", ":")) for s in entry.steps)
    params = json.dumps(dict(entry.params), separators=(",", ":"))
    return (f"- skill '{entry.name}' v{entry.version} (memory {entry.id}): {entry.text}\n"
            f"  verified with params {params}; its steps (replace ${{param}} by this goal's values):\n{steps}")


def memory_prompt(entries: Sequence[MemoryEntry], max_chars: int) -> tuple[str, list[MemoryEntry]]:
    """The prompt section for ``entries`` (best first) within ``max_chars``, and the entries it holds.

    Whole entries only, in order, while they fit; the first one is cut to fit if even it alone does not.
    """
    head = "Memory from earlier runs (verified; use it where it applies, ignore it where it does not):"
    parts, size = [head], len(head)
    used: list[MemoryEntry] = []
    for entry in entries:
        text = _entry_text(entry)
        if size + 1 + len(text) > max_chars:
            if used:
                break
            text = text[: max(0, max_chars - size - 1 - 12)] + " [...cut]"
        parts.append(text)
        used.append(entry)
        size += 1 + len(text)
    return ("\n".join(parts), used) if used else ("", [])


class MemoryRecall:
    """What the planning loop calls before its first plan: the prompt section of the entries relevant to a goal.

    Only admitted entries are ranked (candidates, rejected and retired entries never are); the use count of each
    entry put into the prompt goes up by one. ``last`` keeps the ids of the latest recall (for reports and tests).
    With ``embed=True`` entries are ranked by BM25 and embedding cosine mixed (:mod:`planweave.memory.hybrid`,
    the ``[memory-embed]`` extra and the model package; missing, it raises
    :class:`~planweave.memory.embed.EmbeddingsUnavailable` here, before any run); BM25 alone otherwise.
    """

    def __init__(self, store: MemoryStore, limits: RecallLimits = RecallLimits(), *, embed: bool = False) -> None:
        self.store = store
        self.limits = limits
        self.embed = embed
        self.last: list[int] = []
        if embed:
            from planweave.memory.embed import default_encoder

            default_encoder()  # loads the model now: a missing extra or model package is said before the run

    async def __call__(self, goal: str) -> str:
        admitted = await self.store.entries(status="admitted")
        if self.embed:
            from planweave.memory.hybrid import rank_hybrid

            ranked = [entry for entry, _score in rank_hybrid(goal, admitted, self.limits.k)]
        else:
            ranked = [entry for entry, _score in rank(goal, admitted, self.limits.k)]
        text, used = memory_prompt(ranked, self.limits.max_chars)
        self.last = [e.id for e in used]
        if used:
            await self.store.record_use(self.last)
        return text
