"""Leases on runs in a PostgreSQL journal: a queue of submitted runs that workers claim, renew and hand over.

A run submitted to the queue has a row in ``planweave_leases``: its plan document (its secrets sealed as the
journal seals a run's plan: :meth:`QueuedRun.sealed`, put back by the worker running it) and options, its ``state``
(``queued``, ``running`` or ``done``), and while it runs the ``holder`` (a worker's name), the ``epoch`` and the
``expires_at`` of its lease. A worker claims runs that are queued or whose lease expired (``FOR UPDATE SKIP
LOCKED``: workers never wait for each other's claims) and renews its leases; every claim increments the epoch.

The epoch is a **fencing token**: a journal given a :class:`Fence` (``PostgresJournal.set_fence``) checks, in the
same transaction as each batch it writes, that its holder still holds each run's lease at the epoch it claimed
(the lease rows are read ``FOR SHARE``, so a takeover's claim cannot commit in between). Events of a run whose
lease moved on are refused (not written) and the fence reports the run, so a worker that was paused past its
lease (SIGSTOP, a long GC, a lost network) cannot write into a run another worker now runs. Every event a fenced
journal writes is stamped with its epoch (column ``lease_epoch``): who wrote what can be checked from the journal.

Time is the database's (``now()``), so the workers' clocks need not agree. These tables are created on first use
by :meth:`LeaseStore.open` (their own ``IF NOT EXISTS`` DDL, outside the journal's schema version).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from planweave.core.errors import JournalError, RunError, RunNotFound
from planweave.core.events import Event
from planweave.journal.postgres import parse_url

if TYPE_CHECKING:
    from planweave.engine.protocols import PlanSeal

__all__ = ["DEFAULT_LEASE_S", "Claim", "Fence", "LeaseStore", "LeaseView", "QueuedRun", "WorkerView", "queued_state"]

#: Seconds a lease lasts unless renewed (``planweave worker --lease``).
DEFAULT_LEASE_S = 10.0
#: The channel ``NOTIFY`` wakes idle workers on (a run queued or handed back).
CHANNEL = "planweave_queue"
_LOCK_CLASS = 0x706C_7776  # the journal's advisory lock class ("plwv")
_DDL_KEY = 0  # the journal's DDL key: table creation takes turns with the journal's own

LeaseState = Literal["queued", "running", "done"]
#: The option of a queued run whose plan was sealed: what the seal recorded beside the plan (its nonce).
_PLAN_SEAL = "plan_seal"

_TABLES = (
    """CREATE TABLE IF NOT EXISTS planweave_leases (
        run_id TEXT PRIMARY KEY,
        state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done')),
        holder TEXT,
        epoch BIGINT NOT NULL DEFAULT 0,
        expires_at TIMESTAMPTZ,
        claimed_at TIMESTAMPTZ,
        submitted_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at TIMESTAMPTZ,
        outcome TEXT,
        error TEXT,
        source TEXT NOT NULL,
        plan JSONB NOT NULL,
        options JSONB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS planweave_leases_claimable ON planweave_leases (state, submitted_at)",
    # One row per claim: which worker held which epoch of which run, and since when.
    """CREATE TABLE IF NOT EXISTS planweave_lease_claims (
        run_id TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        holder TEXT NOT NULL,
        previous TEXT,
        claimed_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (run_id, epoch)
    )""",
    """CREATE TABLE IF NOT EXISTS planweave_workers (
        name TEXT PRIMARY KEY,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        lease_s DOUBLE PRECISION NOT NULL,
        started_at TIMESTAMPTZ NOT NULL,
        seen_at TIMESTAMPTZ NOT NULL,
        stopped_at TIMESTAMPTZ
    )""",
)

# Claimable: queued, or running under a lease that expired. SKIP LOCKED: a row another worker is claiming, or
# whose fenced write is in flight, is left for the next round instead of waited for.
_CLAIM = """
WITH picked AS (
    SELECT run_id, holder AS previous FROM planweave_leases
    WHERE state = 'queued' OR (state = 'running' AND expires_at < now())
    ORDER BY submitted_at, run_id LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE planweave_leases l
    SET state = 'running', holder = %(holder)s, epoch = l.epoch + 1, claimed_at = now(),
        expires_at = now() + make_interval(secs => %(lease)s)
    FROM picked WHERE l.run_id = picked.run_id
    RETURNING l.run_id, l.epoch, picked.previous, l.source, l.plan, l.options, l.submitted_at
), logged AS (
    INSERT INTO planweave_lease_claims (run_id, epoch, holder, previous, claimed_at)
    SELECT run_id, epoch, %(holder)s, previous, now() FROM claimed
)
SELECT run_id, epoch, previous, source, plan, options FROM claimed ORDER BY submitted_at, run_id
"""
# Rows are locked in run_id order here and in the fence (below): two statements locking overlapping rows in the
# same order cannot deadlock.
_RENEW = """
WITH mine AS (
    SELECT l.run_id FROM planweave_leases l
    JOIN unnest(%(runs)s::text[], %(epochs)s::bigint[]) AS h(run_id, epoch)
      ON l.run_id = h.run_id AND l.epoch = h.epoch
    WHERE l.holder = %(holder)s AND l.state = 'running'
    ORDER BY l.run_id FOR UPDATE OF l
)
UPDATE planweave_leases l SET expires_at = now() + make_interval(secs => %(lease)s)
FROM mine WHERE l.run_id = mine.run_id RETURNING l.run_id
"""
_FENCE = ("SELECT run_id, epoch FROM planweave_leases WHERE run_id = ANY(%s) AND holder = %s AND state = 'running' "
          "ORDER BY run_id FOR SHARE")
_NEXT_EXPIRY = "SELECT extract(epoch FROM min(expires_at) - now()) FROM planweave_leases WHERE state = 'running'"


@dataclass(frozen=True)
class QueuedRun:
    """What ``submit`` records: the run's id, its plan document, where it came from and its options."""

    run_id: str
    plan: Mapping[str, Any]
    source: str
    options: Mapping[str, Any]

    def sealed(self, seal: PlanSeal | None) -> QueuedRun:
        """This run as the queue may keep it: the secrets in its plan sealed by ``seal`` as the journal seals a
        ``run_created`` plan (what the seal records beside the plan is kept under ``options.plan_seal``)."""
        if seal is None:
            return self
        created = Event(self.run_id, "run_created", 0.0, None, {"plan": dict(self.plan)})
        data = seal.seal(created).data
        if data is created.data:
            return self  # no secret in it
        kept = {k: v for k, v in data.items() if k != "plan"}
        return replace(self, plan=data["plan"], options={**self.options, _PLAN_SEAL: kept})

    def unsealed_plan(self, seal: PlanSeal | None) -> Mapping[str, Any]:
        """The plan to run: the secrets :meth:`sealed` hid put back from this process's environment by ``seal``;
        raises RunError naming what is missing (a variable not set here, or no seal at all)."""
        kept = self.options.get(_PLAN_SEAL)
        if not isinstance(kept, Mapping):
            return self.plan
        if seal is None:
            raise RunError(f"run '{self.run_id}': its queued plan holds sealed secrets, and this worker's engine "
                           "has no seal to put them back (give the engine redact=SecretRedactor())")
        (event,) = seal.unseal([Event(self.run_id, "run_created", 0.0, None, {**kept, "plan": self.plan})])
        plan: Mapping[str, Any] = event.data["plan"]
        return plan


@dataclass(frozen=True)
class Claim:
    """A lease a worker now holds: the run, the epoch (its fencing token) and the holder it took it from."""

    run: QueuedRun
    epoch: int
    previous: str | None

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True)
class LeaseView:
    """One run's row of ``planweave workers``: its state, holder, epoch and the lease's ages in seconds."""

    run_id: str
    state: LeaseState
    holder: str | None
    epoch: int
    held_s: float | None  # since the current holder claimed it
    expires_in_s: float | None  # negative: expired (a worker will take it over)
    outcome: str | None
    error: str | None


@dataclass(frozen=True)
class WorkerView:
    """One worker as ``planweave workers`` shows it; ``seen_s``: seconds since it last renewed its leases."""

    name: str
    pid: int
    host: str
    lease_s: float
    seen_s: float
    stopped: bool
    runs: tuple[LeaseView, ...]

    @property
    def alive(self) -> bool:
        """Renewed within its lease time and not stopped (a worker that stops renewing loses its runs)."""
        return not self.stopped and self.seen_s <= self.lease_s


class Fence:
    """The leases one worker holds ({run: epoch}), checked by a journal in each batch's transaction.

    ``refused(run_id, epoch)`` is called (in the loop, before the batch's flush returns) for every run whose events
    were refused because its lease is no longer held at that epoch; the run's events are not written.
    """

    copy_events = "COPY planweave_events (run_id, at, kind, step, data, lease_epoch) FROM STDIN"

    def __init__(self, holder: str, refused: Callable[[str, int], None]) -> None:
        self.holder = holder
        self.held: dict[str, int] = {}
        self.refused_events = 0  # events refused so far (a worker reports it)
        self._refused = refused

    def hold(self, run_id: str, epoch: int) -> None:
        self.held[run_id] = epoch

    def drop(self, run_id: str, epoch: int) -> None:
        if self.held.get(run_id) == epoch:
            del self.held[run_id]

    async def admit(self, cur: psycopg.AsyncCursor[Any], rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The rows (``run_id`` first) whose run this holder still holds, each with its epoch appended.

        Runs the check inside the caller's transaction; the lease rows stay share-locked until it commits. Rows
        of runs the fence does not hold at all are refused too: a worker writes only into runs it claimed.
        """
        runs = sorted({row[0] for row in rows})
        if not runs:
            return []
        await cur.execute(_FENCE, (runs, self.holder))
        current = dict(await cur.fetchall())
        kept: list[tuple[Any, ...]] = []
        refused: dict[str, int] = {}
        for row in rows:
            run_id = row[0]
            epoch = self.held.get(run_id)
            if epoch is not None and current.get(run_id) == epoch:
                kept.append((*row, epoch))
            else:
                refused[run_id] = refused.get(run_id, 0) + 1
        for run_id, count in refused.items():
            self.refused_events += count
            epoch = self.held.pop(run_id, -1)
            # Soon, not now: the transaction is still open. Still before the batch's flush returns (the commit
            # awaits), so a write-ahead flush of a refused step never lets its tool start.
            asyncio.get_running_loop().call_soon(self._refused, run_id, epoch)
        return kept


class LeaseStore:
    """The queue and the leases of one PostgreSQL journal (its own connections; open with :meth:`open`)."""

    def __init__(self, url: str, conn: psycopg.AsyncConnection[Any], conninfo: str, schema: str | None) -> None:
        self.url = url
        self._conn = conn
        self._conninfo = conninfo
        self._schema = schema
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str) -> LeaseStore:
        """Connect to the journal at ``url`` (its ``?schema=``) and create the lease tables if missing.

        The journal itself must have been opened once on this database (it creates ``planweave_events``).
        """
        conninfo, schema, safe_url = parse_url(url)
        try:
            conn = await _connect(conninfo, schema)
        except psycopg.Error as exc:
            raise JournalError(f"could not connect to the journal {safe_url}: {exc}") from exc
        store = cls(safe_url, conn, conninfo, schema)
        try:
            await store._create_tables()
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, psycopg.Error):
                raise JournalError(f"could not set up the run queue in the journal {safe_url}: {exc}") from exc
            raise
        return store

    async def close(self) -> None:
        await self._conn.close()

    async def _create_tables(self) -> None:
        async with self._conn.transaction():
            await self._conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS, _DDL_KEY))
            for statement in _TABLES:
                await self._conn.execute(statement)
            # The events' writer epoch: NULL for events written without a fence (a plain `planweave run`).
            cur = await self._conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = 'planweave_events' AND column_name = 'lease_epoch'")
            if await cur.fetchone() is None:
                await self._conn.execute("ALTER TABLE planweave_events ADD COLUMN lease_epoch BIGINT")

    async def _run(self, query: str, params: Mapping[str, Any] | Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            async with self._lock, self._conn.cursor() as cur:
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise JournalError(f"the run queue in the journal {self.url} failed: {exc}") from exc

    # -- submitting -----------------------------------------------------------------------------------------------
    async def submit(self, *runs: QueuedRun) -> None:
        """Queue ``runs`` for the workers, in one transaction (all or none); raises RunError naming an id that is
        already queued or in the journal."""
        if not runs:
            return
        ids = [run.run_id for run in runs]
        if len(set(ids)) < len(ids):
            twice = next(r for r in ids if ids.count(r) > 1)
            raise RunError(f"run id '{twice}' is given twice")
        try:
            async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
                await cur.execute("SELECT run_id FROM planweave_events WHERE run_id = ANY(%s) LIMIT 1", (ids,))
                found = await cur.fetchone()
                if found is not None:
                    raise RunError(f"run id '{found[0]}' is already in the journal {self.url}")
                await cur.execute(
                    "INSERT INTO planweave_leases (run_id, state, source, plan, options) "
                    "SELECT r, 'queued', s, p, o FROM unnest(%s::text[], %s::text[], %s::jsonb[], %s::jsonb[]) "
                    "AS u(r, s, p, o) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
                    (ids, [run.source for run in runs], [Jsonb(dict(run.plan)) for run in runs],
                     [Jsonb(dict(run.options)) for run in runs]))
                inserted = {r for (r,) in await cur.fetchall()}
                if len(inserted) < len(runs):
                    taken = next(r for r in ids if r not in inserted)
                    raise RunError(f"run id '{taken}' is already queued in the journal {self.url}")
                await cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        except psycopg.Error as exc:
            raise JournalError(f"could not queue run '{ids[0]}' in the journal {self.url}: {exc}") from exc

    async def state(self, run_id: str) -> LeaseView:
        """The queue row of ``run_id``; raises RunNotFound if it was never submitted."""
        views = await self.leases(run_id)
        if not views:
            raise RunNotFound(f"run '{run_id}' was not submitted to the queue of the journal {self.url}")
        return views[0]

    async def cancel_queued(self, run_id: str, reason: str) -> bool:
        """Mark ``run_id`` done (cancelled) if no worker has claimed it yet; False if one did (or it ended)."""
        rows = await self._run(
            "UPDATE planweave_leases SET state = 'done', outcome = 'cancelled', error = %s, finished_at = now() "
            "WHERE run_id = %s AND state = 'queued' RETURNING run_id", (reason, run_id))
        return bool(rows)

    # -- what a worker does ---------------------------------------------------------------------------------------
    async def register(self, name: str, lease_s: float) -> None:
        """Record worker ``name`` (this process); raises RunError if a live worker of that name renews elsewhere."""
        rows = await self._run(
            """INSERT INTO planweave_workers (name, pid, host, lease_s, started_at, seen_at)
               VALUES (%(name)s, %(pid)s, %(host)s, %(lease)s, now(), now())
               ON CONFLICT (name) DO UPDATE SET pid = EXCLUDED.pid, host = EXCLUDED.host, lease_s = EXCLUDED.lease_s,
                   started_at = now(), seen_at = now(), stopped_at = NULL
               WHERE planweave_workers.stopped_at IS NOT NULL
                  OR planweave_workers.seen_at < now() - make_interval(secs => planweave_workers.lease_s)
               RETURNING name""",
            {"name": name, "pid": os.getpid(), "host": socket.gethostname(), "lease": lease_s})
        if not rows:
            raise RunError(f"a worker named '{name}' is already running on the journal {self.url}: give this one "
                           "another --name")

    async def claim(self, holder: str, n: int, lease_s: float) -> list[Claim]:
        """Claim up to ``n`` runs (queued first come first served, then expired leases) for ``lease_s`` seconds."""
        if n < 1:
            return []
        rows = await self._run(_CLAIM, {"n": n, "holder": holder, "lease": lease_s})
        return [Claim(QueuedRun(run_id, plan, source, options), epoch, previous)
                for run_id, epoch, previous, source, plan, options in rows]

    async def renew(self, holder: str, held: Mapping[str, int], lease_s: float) -> set[str]:
        """Extend the leases ``holder`` holds at these epochs; return the runs it still holds (the rest are lost)."""
        await self._run("UPDATE planweave_workers SET seen_at = now() WHERE name = %s", (holder,))
        if not held:
            return set()
        rows = await self._run(_RENEW, {"runs": list(held), "epochs": list(held.values()), "holder": holder,
                                        "lease": lease_s})
        return {run_id for (run_id,) in rows}

    async def next_expiry(self) -> float | None:
        """Seconds until the first lease expires (negative: one has expired), None if no run is leased."""
        rows = await self._run(_NEXT_EXPIRY)
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    async def finish(self, claim: Claim, holder: str, outcome: str, error: str | None = None) -> bool:
        """Mark the run done with ``outcome`` if ``holder`` still holds it at the claim's epoch."""
        rows = await self._run(
            "UPDATE planweave_leases SET state = 'done', outcome = %s, error = %s, finished_at = now(), "
            "expires_at = NULL WHERE run_id = %s AND epoch = %s AND holder = %s AND state = 'running' "
            "RETURNING run_id", (outcome, error, claim.run_id, claim.epoch, holder))
        return bool(rows)

    async def release(self, claims: Iterable[Claim], holder: str) -> None:
        """Hand runs back to the queue (a worker stopping cleanly): another worker claims them at once."""
        ids = sorted((c.run_id, c.epoch) for c in claims)
        if not ids:
            return
        await self._run(
            """WITH mine AS (
                   SELECT l.run_id FROM planweave_leases l
                   JOIN unnest(%(runs)s::text[], %(epochs)s::bigint[]) AS h(run_id, epoch)
                     ON l.run_id = h.run_id AND l.epoch = h.epoch
                   WHERE l.holder = %(holder)s AND l.state = 'running' ORDER BY l.run_id FOR UPDATE OF l)
               UPDATE planweave_leases l SET state = 'queued', holder = NULL, expires_at = NULL
               FROM mine WHERE l.run_id = mine.run_id""",
            {"runs": [r for r, _ in ids], "epochs": [e for _, e in ids], "holder": holder})
        await self._run("SELECT pg_notify(%s, '')", (CHANNEL,))

    async def retire(self, name: str) -> None:
        """Record that worker ``name`` stopped (it holds nothing any more)."""
        await self._run("UPDATE planweave_workers SET stopped_at = now() WHERE name = %s", (name,))

    async def listen(self, wake: asyncio.Event) -> None:
        """Set ``wake`` whenever a run is queued or handed back (runs until cancelled; its own connection)."""
        try:
            conn = await _connect(self._conninfo, self._schema)
        except psycopg.Error as exc:
            raise JournalError(f"could not connect to the journal {self.url}: {exc}") from exc
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
            async for _ in conn.notifies():
                wake.set()
        except psycopg.Error as exc:
            raise JournalError(f"lost the queue notifications of the journal {self.url}: {exc}") from exc
        finally:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    # -- what `planweave workers` shows ---------------------------------------------------------------------------
    async def leases(self, run_id: str | None = None, *, states: Sequence[LeaseState] = ()) -> list[LeaseView]:
        """Queue rows (of one run, or of ``states``, or all), oldest submission first."""
        where: list[str] = ["TRUE"]
        params: list[Any] = []
        if run_id is not None:
            where.append("run_id = %s")
            params.append(run_id)
        if states:
            where.append("state = ANY(%s)")
            params.append(list(states))
        rows = await self._run(
            "SELECT run_id, state, holder, epoch, extract(epoch FROM now() - claimed_at), "
            "extract(epoch FROM expires_at - now()), outcome, error FROM planweave_leases "
            f"WHERE {' AND '.join(where)} ORDER BY submitted_at, run_id", params)
        return [LeaseView(r, s, h, e, _seconds(held), _seconds(left), o, err)
                for r, s, h, e, held, left, o, err in rows]

    async def workers(self) -> list[WorkerView]:
        """Every worker that registered, with the runs it holds now, most recently seen first."""
        rows = await self._run(
            "SELECT name, pid, host, lease_s, extract(epoch FROM now() - seen_at), stopped_at IS NOT NULL "
            "FROM planweave_workers ORDER BY seen_at DESC, name")
        running = await self.leases(states=("running",))
        by_holder: dict[str, list[LeaseView]] = {}
        for lease in running:
            by_holder.setdefault(lease.holder or "", []).append(lease)
        return [WorkerView(name, pid, host, lease_s, float(seen), stopped, tuple(by_holder.get(name, ())))
                for name, pid, host, lease_s, seen, stopped in rows]


async def queued_state(url: str, run_id: str) -> LeaseView | None:
    """The queue row of ``run_id`` in the journal at ``url``, None if it was never queued (or there is no queue:
    nothing is created)."""
    conninfo, schema, safe_url = parse_url(url)
    try:
        conn = await _connect(conninfo, schema)
    except psycopg.Error as exc:
        raise JournalError(f"could not connect to the journal {safe_url}: {exc}") from exc
    try:
        cur = await conn.execute("SELECT to_regclass('planweave_leases') IS NOT NULL")
        row = await cur.fetchone()
        if not row or not row[0]:
            return None
        views = await LeaseStore(safe_url, conn, conninfo, schema).leases(run_id)
        return views[0] if views else None
    finally:
        await conn.close()


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


async def _connect(conninfo: str, schema: str | None) -> psycopg.AsyncConnection[Any]:
    options: dict[str, Any] = {} if "connect_timeout" in conninfo else {"connect_timeout": 10}
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **options)
    if schema is not None:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    return conn
