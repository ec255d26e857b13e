"""The in-memory journal keeps every event for good, so what it keeps per event must be its size, not a buffer's."""

from __future__ import annotations

import tracemalloc

from planweave.core.events import Event
from planweave.journal.memory import MemoryJournal


def test_a_kept_event_or_output_costs_its_size_not_a_4_kib_buffer() -> None:
    journal = MemoryJournal()
    events = [Event("r", "step_started", 1.0, f"s{i}", {"attempt": 1}) for i in range(2000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for event in events:
            journal.append(event)
        for i in range(2000):
            journal.put_blob({"step": i})
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # About 200 bytes an event and an output (bytes, index entries, the blob's key); orjson's results alone hold
    # 4 KiB each (16 MiB here) until copied.
    assert grown < 2000 * 2 * 400, f"{grown / 4000:,.0f} bytes per event or output"
