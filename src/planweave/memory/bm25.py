"""BM25 over memory entries' text (the ``[memory]`` extra's ``rank-bm25``), shared by plain and hybrid retrieval.

BM25 is ``rank-bm25``'s ``BM25Okapi`` with Lucene's non-negative idf,
``log(1 + (N - n + 0.5) / (n + 0.5))``: rank-bm25's own idf goes negative for a term in more than half the entries
(floored at epsilon times the mean idf, itself negative on a memory of one or two entries), which would rank an
entry sharing words with the goal below one sharing none. An entry with no query term in common is never returned.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from planweave.extras import require
from planweave.memory.model import MemoryEntry

__all__ = ["rank", "tokenize"]

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
