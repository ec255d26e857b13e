"""A new run is in the journal before any of its steps has an effect, so a process killed right after the first
(idempotent) step's effect leaves a run that ``planweave resume`` finds and finishes, on SQLite and PostgreSQL.

An idempotent step does not wait for the journal before its tool is called (only non-idempotent ones do); before the
fix, its effect could come before ``run_created`` was committed, and the killed run was nowhere in the journal
(docs/comparison.md, "Where planweave is worse"). Here the first step's tool writes its effect and then SIGKILLs its
own process, the worst moment there is. Without the fix that test fails only when the kill beats the journal's writer
(most runs on SQLite, some on PostgreSQL, whose server may still commit what was sent before the kill); the tests
with :class:`StoredOnFlush`, a journal that stores only what a flush asks for, fail every time without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from planweave import Event, Toolbox, open_engine
from planweave.core.errors import JournalError, RunError
from planweave.core.state import RunState
from planweave.journal import Journal, open_journal
from planweave.journal.base import CachedOutput
from planweave.journal.summary import ALL_RUNS, PRUNE_DEFAULT, PruneResult, RunPage, RunQuery
from tests.cli.kill import env_with_root
from tests.cli.test_cli import cli_command
from tests.journal.conftest import Backend
from tests.journal.conftest import _make as make_backend


async def effect_then_die(step: str, log: str, once: str) -> dict[str, str]:
    """Append ``step`` to the file ``log``; the first call (the file ``once`` does not exist yet) then SIGKILLs its
    own process, right after its effect. No await before the kill: the event loop (and the journal's writer) does
    not turn again between the tool's call and the kill."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{step}\n".encode())
    finally:
        os.close(fd)
    try:
        os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return {"step": step}  # killed once already: this is the resume
    os.kill(os.getpid(), signal.SIGKILL)
    return {"step": step}


toolbox = Toolbox()
toolbox.add(effect_then_die, idempotent=True)
TOOLS = ("--tools", "tests.engine.test_run_created_durable:toolbox")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request.param, tmp_path)


def planweave(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), cwd=cwd, env=env_with_root(), capture_output=True, text=True, timeout=90)


async def stored(url: str, run_id: str) -> tuple[list[str], list[tuple[str, str | None]]]:
    async with open_journal(url) as journal:
        return await journal.run_ids(), [(e.kind, e.step) for e in await journal.read(run_id)]


def test_a_run_killed_after_its_first_idempotent_effect_is_found_and_resumed(durable: Backend,
                                                                              tmp_path: Path) -> None:
    log, once = tmp_path / "effects.log", tmp_path / "killed-once"
    common: dict[str, Any] = {"log": str(log), "once": str(once)}
    plan = {"name": "killed-after-effect", "steps": [
        {"id": "a", "tool": "effect_then_die", "args": {"step": "a", **common}},
        {"id": "b", "tool": "effect_then_die", "args": {"step": "b", **common}, "after": ["a"]},
    ]}
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan), encoding="utf-8")

    killed = planweave(tmp_path, "run", str(plan_file), "--journal", durable.url, "--run-id", "crash", *TOOLS)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert log.read_text().split() == ["a"]  # the effect happened, and the process died right after it

    run_ids, kinds = asyncio.run(stored(durable.url, "crash"))
    assert run_ids == ["crash"]
    assert kinds[0] == ("run_created", None)
    assert ("step_succeeded", "a") not in kinds

    resumed = planweave(tmp_path, "resume", "crash", "--journal", durable.url, "--json", *TOOLS)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "succeeded"
    assert log.read_text().split() == ["a", "a", "b"]  # a is idempotent: run again by the resume


class StoredOnFlush:
    """A durable journal (SQLite or PostgreSQL underneath) that hands what is appended to its storage only when
    flushed, and knows which runs' ``run_created`` a flush has made durable: what the journal contract allows
    ("``append`` buffers; ``flush`` makes everything buffered durable"), without a race with a background writer."""

    durable = True

    def __init__(self, inner: Journal) -> None:
        self._inner = inner
        self.url = inner.url
        self._held: list[Event] = []
        self.created: set[str] = set()  # runs whose run_created is stored durably

    def _pass_on(self) -> list[str]:
        created = [e.run_id for e in self._held if e.kind == "run_created"]
        for event in self._held:
            self._inner.append(event)
        self._held.clear()
        return created

    def append(self, event: Event) -> None:
        self._held.append(event)

    def put_blob(self, value: Any) -> str:
        return self._inner.put_blob(value)

    async def flush(self) -> None:
        created = self._pass_on()
        await self._inner.flush()
        self.created.update(created)

    async def read(self, run_id: str | None = None, after: int = 0, kind: str | None = None,
                   limit: int | None = None) -> list[Event]:
        await self.flush()
        return await self._inner.read(run_id, after, kind, limit)

    async def get_blobs(self, refs: Iterable[str]) -> dict[str, Any]:
        await self.flush()
        return await self._inner.get_blobs(refs)

    async def run_ids(self) -> list[str]:
        await self.flush()
        return await self._inner.run_ids()

    def track(self, run_id: str, state: RunState, redact: Callable[[Any], Any] | None = None) -> None:
        self._inner.track(run_id, state, redact)

    async def list_runs(self, query: RunQuery = ALL_RUNS) -> RunPage:
        await self.flush()
        return await self._inner.list_runs(query)

    async def prune(self, finished_before: float, statuses: Collection[str] = PRUNE_DEFAULT) -> PruneResult:
        await self.flush()
        return await self._inner.prune(finished_before, statuses)

    async def find_cached(self, key: str, since: float) -> CachedOutput | None:
        return await self._inner.find_cached(key, since)

    async def close(self) -> None:
        await self.flush()


def test_no_idempotent_step_is_called_before_its_run_is_durable(durable: Backend) -> None:
    seen: list[tuple[str, bool]] = []  # (step, whether its run was durable when its tool was called)
    journal: StoredOnFlush

    async def touch(step: str) -> str:
        seen.append((step, "w" in journal.created))
        return step

    tools = Toolbox()
    tools.add(touch, idempotent=True)
    plan = {"name": "wide", "steps": [{"id": s, "tool": "touch", "args": {"step": s}} for s in ("a", "b", "c")]}

    async def main() -> str:
        nonlocal journal
        async with open_journal(durable.url) as inner:
            journal = StoredOnFlush(inner)
            async with open_engine(journal, tools=tools) as engine:
                run = await engine.start(plan, run_id="w")
                result = await run.wait()
            await journal.close()
        return result.status

    assert asyncio.run(main()) == "succeeded"
    assert sorted(seen) == [("a", True), ("b", True), ("c", True)]


class LosesWrites(StoredOnFlush):
    """A journal whose storage is gone (a full disk, a lost connection): a flush with anything to store fails."""

    async def flush(self) -> None:
        if self._held:
            raise JournalError(f"the journal {self.url} lost a write (test)")

    async def close(self) -> None:
        pass


def test_a_run_whose_creation_cannot_be_committed_calls_no_tool_and_is_interrupted(durable: Backend) -> None:
    called: list[str] = []

    async def touch(step: str) -> str:
        called.append(step)
        return step

    tools = Toolbox()
    tools.add(touch, idempotent=True)

    async def main() -> str:
        async with open_journal(durable.url) as inner, open_engine(LosesWrites(inner), tools=tools) as engine:
            run = await engine.start({"steps": [{"id": "a", "tool": "touch", "args": {"step": "a"}}]}, run_id="x")
            with pytest.raises(RunError) as raised:
                await run.wait()
            return str(raised.value)

    message = asyncio.run(main())
    assert "lost a write (test)" in message and "interrupted" in message
    assert called == []
