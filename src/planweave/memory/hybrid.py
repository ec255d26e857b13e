"""Hybrid retrieval: BM25 and embedding cosine together, so a goal phrased in other words still finds its entry.

score = ``bm25_weight`` x (BM25 / the best BM25 of the query) + (1 - ``bm25_weight``) x cosine, over the entries that
share a word with the goal (BM25 above 0) or whose cosine reaches ``min_cosine``; the others are never returned, as
with BM25 alone. Vectors come from :mod:`planweave.memory.embed` (all-MiniLM-L6-v2 in numpy); an entry's vector is
kept by the encoder by its search text, so a memory is encoded once per process, not once per recall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planweave.memory.bm25 import rank
from planweave.memory.model import MemoryEntry

if TYPE_CHECKING:
    from planweave.memory.embed import MiniLMEncoder

__all__ = ["HybridWeights", "rank_hybrid"]


@dataclass(frozen=True)
class HybridWeights:
    """How BM25 and cosine mix, and the cosine an entry sharing no word with the goal needs to be returned."""

    bm25_weight: float = 0.5
    min_cosine: float = 0.2


def rank_hybrid(query: str, entries: Sequence[MemoryEntry], k: int, encoder: MiniLMEncoder | None = None,
                weights: HybridWeights = HybridWeights()) -> list[tuple[MemoryEntry, float]]:
    """The at most ``k`` entries that best match ``query`` by BM25 and cosine mixed, best first (ties: newer)."""
    if not entries or k <= 0 or not query.strip():
        return []
    if encoder is None:
        from planweave.memory.embed import default_encoder

        encoder = default_encoder()
    bm25 = {e.id: score for e, score in rank(query, entries, len(entries))}
    best = max(bm25.values(), default=0.0)
    query_vector = encoder.encode([query])[0]
    cosines = encoder.encode_cached([e.search_text() for e in entries]) @ query_vector
    scored = []
    for entry, cosine in zip(entries, cosines.tolist(), strict=True):
        lexical = bm25.get(entry.id, 0.0) / best if best > 0 else 0.0
        if lexical <= 0 and cosine < weights.min_cosine:
            continue
        scored.append((entry, weights.bm25_weight * lexical + (1 - weights.bm25_weight) * cosine))
    scored.sort(key=lambda pair: (-pair[1], -pair[0].id))
    return scored[:k]
