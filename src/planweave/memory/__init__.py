"""Memory across runs: lessons and skills distilled from finished goal runs, admitted only after verification,
retrieved by BM25 into the planner's prompt (docs/memory.md)."""

from __future__ import annotations

from planweave.memory.model import (
    ENTRY_KINDS,
    ENTRY_STATUSES,
    Candidate,
    EntryKind,
    EntryStatus,
    MemoryEntry,
    MemoryStoreError,
    UnknownEntry,
    instantiate,
    parse_candidates,
)
from planweave.memory.retrieval import MemoryRecall, RecallLimits, memory_prompt, rank
from planweave.memory.store import InMemoryStore, MemoryStore, open_memory_store

__all__ = ["ENTRY_KINDS", "ENTRY_STATUSES", "Candidate", "EntryKind", "EntryStatus", "InMemoryStore",
           "MemoryEntry", "MemoryRecall", "MemoryStore", "MemoryStoreError", "RecallLimits", "UnknownEntry",
           "instantiate", "memory_prompt", "open_memory_store", "parse_candidates", "rank"]
