"""A run's lifecycle: its task and TaskGroup, its first and last events, its holds, and how it ends (finished,
cancelled, failed on purpose, interrupted, or stopped by a journal that lost a write)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planweave.core.errors import EventNotRecorded, JournalError, RunError
from planweave.core.events import EventKind
from planweave.core.state import RunStatus
from planweave.engine.emission import Emission
from planweave.engine.host import RunHost, RunResult

if TYPE_CHECKING:
    from planweave.engine.attempts import Attempts
    from planweave.engine.people import People


class Lifecycle:
    """One run's task, from its first event (``run_created`` or ``run_resumed``) to ``run_finished``."""

    def __init__(self, run_id: str, host: RunHost, emission: Emission, outputs: dict[str, Any], holds: int) -> None:
        self.run_id = run_id
        self.state = emission.state
        self._host = host
        self._emission = emission
        self._outputs = outputs
        self.tg: asyncio.TaskGroup | None = None  # the run's TaskGroup while it runs: its timers, speculative work
        self.done = asyncio.Event()  # no step is active and nothing holds the run: it ends
        self.result: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.cancel_reason: str | None = None
        self.holds = holds
        self._ready = asyncio.Event()
        self._refused: EventNotRecorded | None = None  # the first event, refused by the journal
        self._journal_lost: JournalError | None = None  # a write the journal lost (e.g. a full disk): run stopped
        # Wired by the run once they exist (each needs this lifecycle to be built).
        self.attempts: Attempts
        self.people: People

    @property
    def finished(self) -> bool:
        return self.result.done()

    async def begin(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        """Start the run's task with its first event (``run_created`` or ``run_resumed``; the engine calls this).

        Raises EventNotRecorded (the run never existed) if the journal refuses that event.
        """
        self.task = self._host.start_task(self._main(kind, data), f"planweave-run-{self.run_id}")
        await self._ready.wait()  # the run's TaskGroup exists: its plan can change and it can be cancelled
        if self._refused is not None:
            await asyncio.wait([self.task])
            raise self._refused

    async def _main(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        crashed: BaseException | None = None
        attempts = self.attempts
        try:
            async with asyncio.TaskGroup() as tg:
                self.tg = tg
                failure: BaseException | None = None
                try:
                    await self._drive(kind, data)
                except BaseException as exc:
                    attempts.stop_all()  # as the TaskGroup does with its own tasks when it exits this way
                    failure = exc
                await attempts.join()
                if failure is not None:
                    raise failure
        except asyncio.CancelledError:
            if self.cancel_reason is None:  # the engine is closing: leave the run resumable, record nothing
                if not self.result.done():
                    self.result.set_exception(RunError(self._interrupted()))
                    self.result.exception()  # mark retrieved: nobody may be waiting
                if self._journal_lost is not None:
                    self._host.forget(self.run_id)
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except Exception as exc:  # an engine bug must end the run visibly, not hang it
            crashed = exc
        finally:
            self.tg = None
        if self._refused is not None:
            return  # nothing was journaled or applied: begin reports it, and there is no run_finished
        status: RunStatus
        error: str | None
        if crashed is not None:
            status, error = "failed", f"internal error: {type(crashed).__name__}: {crashed}"
        else:
            status, error = self.state.outcome()
        self._emission.emit("run_finished", None, {"status": status, "error": error})
        try:
            await self._host.journal.flush()
        except JournalError as exc:
            error = f"{error}; and the journal could not be written: {exc}" if error else str(exc)
        self._host.forget(self.run_id)
        self.result.set_result(RunResult(self.run_id, status, error, self._outputs, self.state))

    async def _drive(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        """The run inside its TaskGroup: its first event, then until no step is active (or it is stopped)."""
        emission = self._emission
        on_ready = emission.on_ready
        # A new run on a durable journal is committed before any of its steps is handed on: an idempotent step does
        # not wait for the journal before its tool is called, and a process killed after its effect must leave a run
        # that a resume can find (docs/comparison.md, "Where planweave is worse"). One commit per run started.
        holding = kind == "run_created" and self._host.journal.durable
        held: list[tuple[Sequence[str], float]] = []  # what the first event made ready, handed on once it is durable
        if holding:
            emission.on_ready = lambda ready, now: held.append((ready, now))
        try:
            emission.emit(kind, None, data)
        except EventNotRecorded as exc:
            emission.on_ready = on_ready
            self._refused = exc
            return
        finally:
            self._ready.set()
        if holding:
            try:
                await self._host.journal.flush()
            except JournalError as exc:  # the run may not exist for a resume: stopped before anything ran
                self.stop_unrecordable(exc)
                await asyncio.sleep(0)  # where the cancellation stop_unrecordable asked for arrives
            finally:
                emission.on_ready = on_ready
            records = self.state.records
            for ready, now in held:  # a plan change meanwhile may have replaced or removed some of them
                still = [sid for sid in ready if (rec := records.get(sid)) is not None and rec.status == "ready"]
                if still:
                    on_ready(still, now)
        if kind != "run_created":  # a new run has nobody to wait for yet
            self.people.rewait()
        attempts = self.attempts
        self._host.dispatch.pump()
        attempts.speculate()
        self.check_done()
        await self.done.wait()
        if attempts.spec is not None:
            attempts.spec.close()
        attempts.cancel_timers()

    def check_done(self) -> None:
        """End the run once no step is active and nothing holds it."""
        if not self.state.active and not self.holds:
            self.done.set()

    def check_alive(self) -> None:
        """Raise RunError unless the run is running and not being cancelled (its plan can still change)."""
        if self.finished or self.tg is None or self.cancel_reason is not None:
            raise RunError(f"run '{self.run_id}' is not running: its plan can no longer change")

    def cancel(self, reason: str, *, failed: bool = False) -> None:
        """Stop the run (``failed``: ended failed on purpose); a no-op once it is ending or ended."""
        if self.finished or self.cancel_reason is not None or self.task is None:
            return
        self.cancel_reason = reason
        self._emission.emit("run_cancelled", None, {"reason": reason, "status": "failed"} if failed
                            else {"reason": reason})
        self._host.dispatch.withdraw(self.attempts)
        self.task.cancel()

    def interrupt(self) -> None:
        """Stop the run without deciding its outcome (the engine is closing): the journal keeps it resumable."""
        if self.task is not None:
            self.task.cancel()

    def stop_unrecordable(self, exc: JournalError) -> None:
        """The journal lost a write (a full disk, a lost connection): stop the run, resumable from what it holds.

        Not a failure of the step whose write-ahead record failed: nothing more of the run can be recorded, and a
        new process can continue it once the journal can be written again.
        """
        if self._journal_lost is None:
            self._journal_lost = exc
        if self.task is not None:
            self.task.cancel()

    def _interrupted(self) -> str:
        if self._journal_lost is not None:
            return (f"run '{self.run_id}' was interrupted: {self._journal_lost}; resume it once the journal can be "
                    "written again")
        return f"run '{self.run_id}' was interrupted; resume it to continue"

    def release(self) -> None:
        """Give back one hold; raises RunError if the run holds none."""
        if self.holds <= 0:
            raise RunError(f"run '{self.run_id}' holds nothing to release (a resumed run holds only with hold=True)")
        self.holds -= 1
        self.check_done()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        """Start ``coro`` in the run's TaskGroup (None, ``coro`` closed, when the run is ending)."""
        if self.tg is None:
            coro.close()
            return None
        try:
            return self.tg.create_task(coro, name=name)
        except RuntimeError:
            coro.close()
            return None

    def crash(self, exc: BaseException) -> None:
        """An attempt's task raised (an engine bug): hand the error to the run's TaskGroup, which ends the run with
        it as it would for one of its own tasks (``internal error``, or the process's SystemExit)."""

        async def reraise() -> None:
            raise exc

        try:
            assert self.tg is not None
            self.tg.create_task(reraise())
        except (AssertionError, RuntimeError):  # the group is shutting down already: report it at least
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"an attempt of run '{self.run_id}' failed", "exception": exc})
