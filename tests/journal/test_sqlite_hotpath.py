"""The SQLite journal writes a batch's events many rows per INSERT (journal/sqlite.py, _ROWS_PER_INSERT): a batch
larger than one statement must store every event once, in append order, with consecutive positions, the data as
the same BLOB bytes, and the run summaries at the right positions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from planweave.core.events import Event
from planweave.journal.sqlite import _ROWS_PER_INSERT, SQLiteJournal


async def test_a_batch_of_several_statements_keeps_order_positions_and_bytes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = await SQLiteJournal.open(f"sqlite:///{path}")
    count = 2 * _ROWS_PER_INSERT + 37  # two whole statements and a remainder, all in one batch
    sent = []
    for i in range(count):
        run = f"run-{i % 3}"  # interleaved runs: the summaries' positions depend on the rows' order
        step = None if i % 10 == 0 else f"s{i}"
        sent.append(Event(run, "step_started", 1000.0 + i, step, {"attempt": 1, "i": i, "text": "é\u00ff"}))
    for event in sent:  # appended synchronously: nothing is written before the flush's batch
        journal.append(event)
    await journal.flush()
    assert journal.commits == 1
    got = await journal.read()
    await journal.close()

    assert [(e.run_id, e.kind, e.at, e.step, e.data) for e in got] == [
        (e.run_id, e.kind, e.at, e.step, e.data) for e in sent]
    assert [e.pos for e in got] == list(range(1, count + 1))
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT typeof(data), data FROM events ORDER BY pos").fetchall()
        assert {kind for kind, _ in rows} == {"blob"}
        assert rows[5][1] == b'{"attempt":1,"i":5,"text":"\xc3\xa9\xc3\xbf"}'
        runs = dict(conn.execute("SELECT run_id, seq FROM runs").fetchall())
        last = dict(conn.execute("SELECT run_id, pos FROM runs").fetchall())
    finally:
        conn.close()
    assert runs == {"run-0": 1, "run-1": 2, "run-2": 3}
    assert last == {f"run-{r}": max(i + 1 for i in range(count) if i % 3 == r) for r in range(3)}
