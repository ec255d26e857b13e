"""The rollout engine: many agent episodes over an environment, their model calls served by a policy the trainer
keeps updating, finished trajectories streamed to the trainer in batches under a staleness bound.

    async with RolloutEngine(policy=client, env=make_env, max_staleness=2, concurrency=256,
                             journal="sqlite:///rollouts.db") as rollouts:
        async for batch in rollouts.batches(size=64):    # as they finish, oldest policy first
            version = trainer.step(batch)
            await rollouts.update_policy(version)         # in-flight episodes follow the staleness policy

Readiness, not polling: an episode starts when a slot frees (an episode ended, the consumer took a batch), a batch
is handed out when the trajectory that completes it finishes. Decisions are :mod:`planweave.rollouts.staleness`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Self

from planweave.core.clock import Clock, RealClock
from planweave.core.errors import PlanweaveError
from planweave.models.base import Completion, CompletionRequest, Message, ModelClient
from planweave.rollouts.journal import InFlight, RolloutJournal, open_rollout_journal
from planweave.rollouts.samples import Sample
from planweave.rollouts.staleness import Backpressure, StalenessBound, StalePolicy, take_batch
from planweave.rollouts.trajectory import Interruption, Trajectory, Turn

_REDACTED = "***"  # what tools.safety's redaction puts in place of a secret


class RolloutError(PlanweaveError):
    """Rollouts cannot go on: episodes keep failing, a resumed episode's environment disagrees with its journal."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What an environment answers an action with."""

    observation: str
    reward: float = 0.0
    done: bool = False


class Environment(Protocol):
    """An episode's world: ``reset()`` gives the first observation, ``step(action)`` acts (the action is the model's
    reply). It must be deterministic in its seed and the actions taken, so a resumed episode can be replayed."""

    async def reset(self) -> str: ...

    async def step(self, action: str) -> StepResult: ...


EnvFactory = Callable[[int], Environment]
"""Builds an episode's environment from its seed."""
RewardFunction = Callable[[Trajectory], float | Awaitable[float]]
"""Scores a finished episode (a verifier); by default the sum of its turns' rewards."""


@dataclass(frozen=True, slots=True)
class Batch(Sequence[Trajectory]):
    """Trajectories handed to the consumer, with the policy version current when they were delivered."""

    trajectories: tuple[Trajectory, ...]
    version: int
    number: int

    def __len__(self) -> int:
        return len(self.trajectories)

    def __getitem__(self, index: int) -> Trajectory:  # type: ignore[override]
        return self.trajectories[index]

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    @property
    def staleness(self) -> tuple[int, ...]:
        """Each trajectory's staleness at delivery."""
        return tuple(t.staleness(self.version) for t in self.trajectories)


@dataclass(slots=True)
class RolloutStats:
    """Counts of what the engine did (also what the benchmark reports)."""

    started: int = 0
    resumed: int = 0
    finished: int = 0
    delivered: int = 0
    acked: int = 0
    interrupted: int = 0
    dropped_in_flight: int = 0
    dropped_waiting: int = 0
    failed: int = 0
    paused: int = 0  # times a free slot stayed empty because the consumer lagged
    staleness: dict[int, int] = field(default_factory=dict)  # staleness at delivery -> trajectories


@dataclass(slots=True)
class _Episode:
    episode: int
    seed: int
    turns: list[Turn] = field(default_factory=list)
    interruptions: list[Interruption] = field(default_factory=list)
    observation: str | None = None
    replay: tuple[Turn, ...] = ()
    task: asyncio.Task[None] | None = None
    call: asyncio.Task[Completion] | None = None
    call_version: int | None = None
    interrupting: bool = False
    samples: list[Sample] = field(default_factory=list)  # a goal-run episode's model calls (rollouts/goals.py)
    in_flight: Callable[[], int | None] | None = None  # the oldest version among its calls in flight at the gateway

    def oldest(self) -> int | None:
        versions = [t.version for t in self.turns if t.trainable]
        versions += [s.policy_version for s in self.samples if s.trainable]
        if self.call is not None and self.call_version is not None:
            versions.append(self.call_version)
        waiting = self.in_flight() if self.in_flight is not None else None
        if waiting is not None:
            versions.append(waiting)
        return min(versions) if versions else None


class RolloutEngine:
    """Runs episodes with ``policy`` over environments from ``env`` and delivers their trajectories in batches.

    ``max_staleness`` versions bound every delivered trajectory (``on_stale``: ``partial`` or ``drop``, see
    :data:`StalePolicy`); at most ``concurrency`` episodes run; none starts while ``max_lag_batches`` batches wait for
    the consumer; ``episodes`` (None: no end) trajectories are produced in all; ``journal`` (``sqlite:///PATH``)
    makes them durable. ``logprobs`` asks the endpoint for each token's top N logprobs. ``redact`` (optional, e.g.
    ``tools.safety.SecretRedactor()``, as ``planweave rollouts run`` passes) rewrites everything stored or delivered:
    the journaled observations and turns, and the trajectories (observations, prompts, actions) handed to the
    consumer and so to a sink; the live episode's own prompts keep what the environment and the policy said.
    """

    def __init__(
        self,
        policy: ModelClient | None,
        env: EnvFactory | None,
        *,
        max_staleness: int = 1,
        on_stale: StalePolicy = "partial",
        concurrency: int = 16,
        max_lag_batches: int = 2,
        episodes: int | None = None,
        max_turns: int = 32,
        seed: int = 0,
        journal: str | None = None,
        system: str | None = None,
        logprobs: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        reward: RewardFunction | None = None,
        max_failures: int = 8,
        clock: Clock | None = None,
        redact: Callable[[Any], Any] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if episodes is not None and episodes < 0:
            raise ValueError(f"episodes must be at least 0, got {episodes}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.policy = policy
        self.env = env
        self.bound = StalenessBound(max_staleness, on_stale)
        self.backpressure = Backpressure(max_lag_batches)
        self.concurrency = concurrency
        self.total = episodes
        self.max_turns = max_turns
        self.seed = seed
        self.system = system
        self.logprobs = logprobs
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.reward = reward
        self.max_failures = max_failures
        self.clock = clock or RealClock()
        self.redact = redact
        self.stats = RolloutStats()
        self._journal_url = journal
        self._journal: RolloutJournal = open_rollout_journal(None)
        self._version = 0
        self._rollout = ""  # the journal's id, in every trajectory's meta: how a sink knows one delivered again
        self._next_id = 0
        self._kept = 0  # acked + waiting + delivered-unacked: what counts toward ``episodes``
        self._running: dict[int, _Episode] = {}
        self._resume: list[InFlight] = []
        self._ready: list[Trajectory] = []
        self._unacked: list[int] = []
        self._batch_size: int | None = None
        self._batches = 0
        self._wake = asyncio.Event()
        self._failures = 0
        self._error: BaseException | None = None
        self._group: asyncio.TaskGroup | None = None

    @property
    def running(self) -> int:
        """Episodes in flight."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Finished trajectories not yet taken by the consumer."""
        return len(self._ready)

    async def settled(self) -> None:
        """Return once no episode runs (production paused, or nothing more to start)."""
        while self._running or (self._resume and self._batch_size is not None):
            self._wake.clear()
            await self._wake.wait()

    @property
    def version(self) -> int:
        """The policy version new model calls are tagged with."""
        return self._version

    async def __aenter__(self) -> Self:
        self._journal = open_rollout_journal(self._journal_url)
        found = self._journal.recover()
        self._version = found.version
        self._rollout = found.rollout
        self._next_id = found.next_episode
        self._resume = list(found.in_flight)
        self._ready = [t for t in found.unacked if self._keep_waiting(t)]
        self._kept = found.acked + len(self._ready)
        self.stats.acked = found.acked
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for ep in list(self._running.values()):
            if ep.task is not None:
                ep.task.cancel()
        group, self._group = self._group, None
        try:
            if group is not None:
                await group.__aexit__(None, None, None)
        finally:
            self._journal.close()

    # -- the consumer's side -----------------------------------------------------------------------------------------
    async def batches(self, size: int) -> AsyncGenerator[Batch, None]:
        """Batches of ``size`` trajectories as they finish (oldest policy first); the last may be smaller when
        ``episodes`` runs out. Asking for the next batch acknowledges the previous one (so does :meth:`ack` and
        :meth:`update_policy`): an unacknowledged batch is delivered again after a restart."""
        if size < 1:
            raise ValueError(f"batch size must be at least 1, got {size}")
        self._batch_size = size
        self._fill()
        while True:
            self._ack_delivered()
            while len(self._ready) < size and not self._exhausted():
                if self._error is not None:
                    raise self._error
                self._wake.clear()
                await self._wake.wait()
            if self._error is not None:
                raise self._error
            if not self._ready:
                return
            chosen, self._ready = take_batch(self._ready, size)
            self._batches += 1
            batch = Batch(tuple(chosen), self._version, self._batches)
            for trajectory in chosen:
                s = trajectory.staleness(self._version)
                self.stats.staleness[s] = self.stats.staleness.get(s, 0) + 1
            self.stats.delivered += len(chosen)
            self._unacked = [t.episode for t in chosen]
            self._fill()  # the consumer took a batch: production may resume
            yield batch

    def ack(self, batch: Batch | None = None) -> None:
        """Acknowledge the delivered batch: it is never delivered again, also after a restart."""
        del batch  # only the last delivered batch is ever unacknowledged
        self._ack_delivered()

    async def update_policy(self, version: int | None = None) -> int:
        """Move to the policy ``version`` (None: the next one); acknowledges the delivered batch. In-flight
        episodes that would exceed the bound are interrupted and resumed on it, or dropped; waiting trajectories
        that would are dropped. Returns the new version."""
        new = self._version + 1 if version is None else version
        if new < self._version:
            raise ValueError(f"policy version {new} is older than the current version {self._version}")
        self._ack_delivered()
        self._version = new
        self._journal.set_version(new)
        for ep in list(self._running.values()):
            action = self.bound.on_update(ep.oldest(), new)
            if action == "drop":
                self._drop(ep)
            elif action == "interrupt":
                self._interrupt(ep, new)
        self._ready = [t for t in self._ready if self._keep_waiting(t)]
        self._fill()
        self._wake.set()
        return new

    # -- production --------------------------------------------------------------------------------------------------
    def _exhausted(self) -> bool:
        """Nothing more can come: no episode runs and none may start."""
        return not self._running and not self._resume and (self.total is not None and self._kept >= self.total)

    def _fill(self) -> None:
        """Start episodes while slots are free, the consumer keeps up and ``episodes`` allows."""
        if self._group is None or self._batch_size is None or self._error is not None:
            return
        while len(self._running) < self.concurrency:
            if not self.backpressure.may_start(len(self._ready), self._batch_size):
                self.stats.paused += 1
                return
            if self._resume:
                found = self._resume.pop(0)
                ep = _Episode(found.episode, found.seed, interruptions=list(found.interruptions),
                              observation=found.observation, replay=found.turns)
                self.stats.resumed += 1
            elif self.total is None or self._kept + len(self._running) < self.total:
                ep = _Episode(self._next_id, self.seed + self._next_id)
                self._next_id += 1
                self.stats.started += 1
            else:
                return
            self._running[ep.episode] = ep
            ep.task = self._group.create_task(self._episode(ep), name=f"rollout episode {ep.episode}")

    def _drop(self, ep: _Episode) -> None:
        self.stats.dropped_in_flight += 1
        self._running.pop(ep.episode, None)
        self._journal.dropped(ep.episode)
        if ep.task is not None:
            ep.task.cancel()

    def _interrupt(self, ep: _Episode, new: int) -> None:
        """Keep the episode's finished turns (those now outside the bound no longer trainable) and re-issue an
        in-flight call served by a too old policy on the new one."""
        floor = new - self.bound.max_staleness
        ep.turns = [t if t.version >= floor else replace(t, trainable=False) for t in ep.turns]
        ep.samples = [s if s.policy_version >= floor else replace(s, trainable=False) for s in ep.samples]
        ep.interruptions.append(Interruption(len(ep.turns) + len(ep.samples), ep.oldest() or new, new))
        self.stats.interrupted += 1
        if ep.call is not None and ep.call_version is not None and ep.call_version < floor:
            ep.interrupting = True
            ep.call.cancel()

    def _keep_waiting(self, trajectory: Trajectory) -> bool:
        if self.bound.deliverable(trajectory, self._version):
            return True
        self.stats.dropped_waiting += 1
        self._kept -= 1
        self._journal.dropped(trajectory.episode)
        return False

    def _ack_delivered(self) -> None:
        if self._unacked:
            self._journal.acked(self._unacked)
            self.stats.acked += len(self._unacked)
            self._unacked = []

    async def _episode(self, ep: _Episode) -> None:
        try:
            trajectory = await self._play(ep)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an episode's failure is counted; too many in a row stop the rollouts
            self._running.pop(ep.episode, None)
            self.stats.failed += 1
            self._failures += 1
            self._journal.dropped(ep.episode)
            if self._failures >= self.max_failures or isinstance(exc, RolloutError):
                message = self._hidden(str(exc) if isinstance(exc, RolloutError) else f"{type(exc).__name__}: {exc}")
                self._error = RolloutError(f"rollout episode {ep.episode} failed ({message}); "
                                           f"{self._failures} episodes failed in a row")
            self._wake.set()
            self._fill()
            return
        self._failures = 0
        self._running.pop(ep.episode, None)
        self.stats.finished += 1
        if self.bound.deliverable(trajectory, self._version):
            self._journal.finished(trajectory)
            self._ready.append(trajectory)
            self._kept += 1
        else:  # cannot happen while every update re-checks in-flight episodes; kept as the bound's last guard
            self.stats.dropped_waiting += 1
            self._journal.dropped(ep.episode)
        self._wake.set()
        self._fill()

    def _hidden(self, value: Any) -> Any:
        """``value`` as it may be stored (journal, consumer, sink): with :attr:`redact` applied."""
        return value if self.redact is None else self.redact(value)

    async def _play(self, ep: _Episode) -> Trajectory:
        if self.env is None or self.policy is None:
            raise RolloutError("a RolloutEngine of reset/step environments needs policy= and env=")
        env = self.env(ep.seed)
        first = await env.reset()
        if ep.observation is not None and self._hidden(first) != ep.observation:
            raise RolloutError(f"episode {ep.episode} (seed {ep.seed}): reset() gave {self._hidden(first)[:60]!r}, "
                               f"the journal has {ep.observation[:60]!r}: the environment is not deterministic in "
                               f"its seed")
        done = False
        for turn in ep.replay:  # a resumed episode: replay its journaled actions, without model calls
            result = await env.step(turn.action)
            if self._hidden(result.observation) != turn.observation:
                if self.redact is not None and _REDACTED in turn.action:
                    # the journal keeps the action with its secret redacted, so it cannot be replayed: the episode
                    # starts again from its first turn (same id and seed, a fresh environment)
                    env, done = self.env(ep.seed), False
                    first = await env.reset()
                    ep.replay, ep.turns, ep.interruptions = (), [], []
                    break
                raise RolloutError(f"episode {ep.episode} turn {turn.index}: replaying {turn.action[:40]!r} gave "
                                   f"{self._hidden(result.observation)[:60]!r}, the journal has "
                                   f"{turn.observation[:60]!r}")
            ep.turns.append(replace(turn, observation=result.observation))  # the prompts see what the live run saw
            done = turn.done
        if not ep.turns:
            self._journal.started(ep.episode, ep.seed, self._hidden(first))
        ep.observation = first
        while not done and len(ep.turns) < self.max_turns:
            prompt = self._messages(ep, first)
            completion, version = await self._call(ep, prompt)
            result = await env.step(completion.text)
            turn = Turn(index=len(ep.turns), prompt=tuple((m.role, m.content) for m in prompt),
                        action=completion.text, version=version, observation=result.observation,
                        reward=float(result.reward), done=bool(result.done), prompt_tokens=completion.prompt_tokens,
                        completion_tokens=completion.completion_tokens, logprobs=completion.logprobs)
            ep.turns.append(turn)
            self._journal.turn(ep.episode, self._stored(turn), ep.interruptions)
            done = result.done
        trajectory = Trajectory(ep.episode, ep.seed, first, tuple(ep.turns), sum(t.reward for t in ep.turns),
                                tuple(ep.interruptions), resumed=bool(ep.replay),
                                meta={"finished_at": self.clock.now(), "version_at_finish": self._version,
                                      "rollout": self._rollout})
        if self.reward is not None:
            score = self.reward(trajectory)
            if not isinstance(score, int | float):
                score = await score
            trajectory = replace(trajectory, reward=float(score))
        if self.redact is None:
            return trajectory
        return Trajectory.from_json(self.redact(trajectory.to_json()), f"episode {ep.episode} redacted")

    def _stored(self, turn: Turn) -> Turn:
        return turn if self.redact is None else Turn.from_json(self.redact(turn.to_json()), f"turn {turn.index}")

    def _messages(self, ep: _Episode, first: str) -> list[Message]:
        messages = [Message("system", self.system)] if self.system else []
        messages.append(Message("user", first))
        for turn in ep.turns:
            messages += [Message("assistant", turn.action), Message("user", turn.observation)]
        return messages

    async def _call(self, ep: _Episode, prompt: list[Message]) -> tuple[Completion, int]:
        """One model call tagged with the version that served it; interrupted by an update (partial rollout), it is
        issued again on the new policy."""
        request = CompletionRequest(messages=tuple(prompt), max_tokens=self.max_tokens, temperature=self.temperature,
                                    logprobs=self.logprobs)
        assert self.policy is not None
        while True:
            ep.call_version = self._version
            ep.call = asyncio.ensure_future(self.policy.complete(request))
            try:
                completion = await ep.call
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if ep.interrupting and task is not None and task.cancelling() == 0:
                    ep.interrupting = False
                    continue
                ep.call.cancel()
                raise
            finally:
                ep.call = None
            version = ep.call_version
            return completion, version

