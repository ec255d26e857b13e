"""Episodes that are planweave runs: a goal run (planner, tools, parallel steps, repairs, joiner) or a plan run with
``llm`` steps, each calling the policy through its own session on the rollout gateway, delivered to the trainer in
batches under the staleness bound, one :class:`~planweave.rollouts.samples.Sample` per model call.

    async with Gateway(upstream, dialect="vllm") as gateway, open_engine("memory://") as engine, \\
            GoalRollouts(gateway, engine, episodes_from=make_episode, reward=score, max_staleness=1,
                         concurrency=8, episodes=64) as rollouts:
        async for batch in rollouts.batches(size=16):
            rows = to_trl(samples_of(batch))
            await rollouts.update_policy(trainer.step(rows))

Each episode gets a session (its own URL, key and headers: an :class:`~planweave.models.endpoint.Endpoint` for its
run alone, never a process-wide variable), its own budget and deadline (:class:`EpisodeSpec`), and its model client
tags every call with the run, step, plan version and purpose (:func:`~planweave.rollouts.gateway.tagging_http`).
When the run ends, ``reward`` scores it (sync or async; it may start a verifier run on the engine) and gives one
reward for every call or one per call. The batching, acknowledgements, backpressure, the journal and the staleness
decisions are :class:`~planweave.rollouts.engine.RolloutEngine`'s; here a policy update also re-samples, on the new
policy, the gateway calls in flight that it leaves outside the bound (``on_stale="partial"``).

A rollout process killed mid-episode runs that episode again from its start when resumed (same id and seed, a new
session): the calls of the killed attempt are never delivered, finished episodes not yet acknowledged are delivered
again (a sink skips what it holds), acknowledged ones never.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx

from planweave.rollouts.engine import RolloutEngine, RolloutError, _Episode
from planweave.rollouts.gateway import Gateway, tagging_http
from planweave.rollouts.samples import Sample
from planweave.rollouts.staleness import StalePolicy
from planweave.rollouts.trajectory import Trajectory

if TYPE_CHECKING:
    from planweave.core.clock import Clock
    from planweave.engine.runtime import Engine, RunResult
    from planweave.models.base import ModelClient
    from planweave.tools.registry import Toolbox


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """What one episode runs: ``goal`` (a goal run: the planner on the policy, ``tools`` plus ``llm``) or ``plan``
    (a plan document whose ``llm`` steps call the policy), its own ``budget_tokens``/``budget_usd`` and ``deadline``
    (seconds), ``max_replans``, the ``model`` name sent, and ``headers`` for its endpoint. ``planner`` (a goal
    run only): another model client plans and joins (a fixed planner, e.g. ``scripted:FILE`` or an API model) while
    the run's ``llm`` steps call the policy through the session, within the same budget; only the policy's calls
    are samples."""

    goal: str | None = None
    plan: Mapping[str, Any] | None = None
    tools: Toolbox | None = None
    budget_tokens: int | None = None
    budget_usd: float | None = None
    deadline: float | None = None
    max_replans: int | None = None
    model: str = "policy"
    headers: Mapping[str, str] = field(default_factory=dict)
    planner: ModelClient | None = None

    def __post_init__(self) -> None:
        if (self.goal is None) == (self.plan is None):
            raise ValueError("an EpisodeSpec has a goal or a plan (exactly one)")
        if self.planner is not None and self.goal is None:
            raise ValueError("an EpisodeSpec planner plans a goal: give goal=, not plan=")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"EpisodeSpec deadline must be positive seconds, got {self.deadline}")


@dataclass(frozen=True, slots=True)
class EpisodeOutcome:
    """How an episode's run ended, what a reward hook scores: the run's ``status`` (``succeeded``, ``failed``,
    ``cancelled`` or ``deadline``), its result (None when the deadline cut it), the joiner's ``answer``, the
    ``samples`` of its model calls, and the ``engine`` (to start a verifier run)."""

    episode: int
    seed: int
    spec: EpisodeSpec
    run_id: str
    status: str
    answer: str | None
    result: RunResult | None
    samples: tuple[Sample, ...]
    engine: Engine


EpisodeSource = Callable[[int], EpisodeSpec]
"""The episode of a seed (deterministic in it: a resumed episode runs again from its start)."""
EpisodeReward = Callable[[EpisodeOutcome], "float | Sequence[float] | Awaitable[float | Sequence[float]]"]
"""Scores an ended episode: one reward shared by every call, or one per call (``outcome.samples`` order)."""


class GoalRollouts(RolloutEngine):
    """Goal-run (or plan-run) episodes through ``gateway`` on ``engine``; see the module docstring. The other
    arguments are :class:`RolloutEngine`'s. Without ``reward`` an episode scores 1.0 if its run succeeded, else 0."""

    def __init__(
        self,
        gateway: Gateway,
        engine: Engine,
        *,
        episodes_from: EpisodeSource,
        reward: EpisodeReward | None = None,
        max_staleness: int = 1,
        on_stale: StalePolicy = "partial",
        concurrency: int = 8,
        max_lag_batches: int = 2,
        episodes: int | None = None,
        seed: int = 0,
        journal: str | None = None,
        max_failures: int = 8,
        clock: Clock | None = None,
        redact: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(None, None, max_staleness=max_staleness, on_stale=on_stale, concurrency=concurrency,
                         max_lag_batches=max_lag_batches, episodes=episodes, seed=seed, journal=journal,
                         max_failures=max_failures, clock=clock, redact=redact)
        self.gateway = gateway
        self.engine = engine
        self.episodes_from = episodes_from
        self.episode_reward = reward
        self.resampled = 0  # gateway calls issued again on a newer policy
        self._attempts = 0  # episodes started by this process: each gets a fresh session and run id
        self._process = uuid.uuid4().hex[:8]
        self._http: httpx.AsyncClient | None = None
        self._roots: set[str] = set()  # the run ids of the episodes' goal or plan runs (their root runs)

    async def update_policy(self, version: int | None = None) -> int:
        """:meth:`RolloutEngine.update_policy`, and the gateway serves the new version: calls in flight older than
        the bound allows are issued again on it (``partial``) or their episode is dropped (``drop``)."""
        new = self._version + 1 if version is None else version
        if new < self._version:
            raise ValueError(f"policy version {new} is older than the current version {self._version}")
        partial = self.bound.on_stale == "partial"
        self.resampled += self.gateway.set_version(new, floor=new - self.bound.max_staleness if partial else None)
        return await super().update_policy(new)

    async def __aenter__(self) -> GoalRollouts:
        await super().__aenter__()
        self.gateway.set_version(self._version)  # a resumed rollout serves the journal's version
        # one connection pool for every episode's client (building an HTTP client costs an SSL context, ~0.1 s);
        # the tags are per call, from the calling task's context
        self._http = tagging_http(self.engine, roots=self._roots.__contains__)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await super().__aexit__(*exc_info)
        finally:
            if self._http is not None:
                await self._http.aclose()
                self._http = None

    async def _play(self, ep: _Episode) -> Trajectory:
        restarted = ep.observation is not None  # in flight when a previous process died: runs again from its start
        spec = self.episodes_from(ep.seed)
        if not isinstance(spec, EpisodeSpec):
            raise RolloutError(f"episodes_from({ep.seed}) returned {type(spec).__name__}, not an EpisodeSpec")
        what = spec.goal if spec.goal is not None else str(spec.plan.get("name", "plan") if spec.plan else "plan")
        ep.samples, ep.turns = [], []
        self._journal.started(ep.episode, ep.seed, self._hidden(what))
        ep.observation = what
        attempt, self._attempts = self._attempts, self._attempts + 1
        session_name = f"{self._rollout[:8]}-{self._process}-e{ep.episode}-a{attempt}"
        floor_of = self.bound.max_staleness

        def record(sample: Sample) -> None:
            if sample.policy_version < self._version - floor_of:  # served by a policy the bound no longer allows
                sample = replace(sample, trainable=False)
            ep.samples.append(sample)

        session = self.gateway.open_session(session_name, episode=ep.episode, on_sample=record)
        ep.in_flight = session.oldest_in_flight
        run_id = f"rollout-{session_name}"
        self._roots.add(run_id)
        try:
            status, result = await self._run(spec, session.endpoint(spec.headers), run_id)
        finally:
            with contextlib.suppress(Exception):
                self.gateway.close_session(session_name)
            ep.in_flight = None
            self._roots.discard(run_id)
        samples = tuple(replace(s, index=i) for i, s in enumerate(sorted(ep.samples, key=lambda s: s.index)))
        outcome = EpisodeOutcome(ep.episode, ep.seed, spec, run_id, status,
                                 result.answer if result is not None else None, result, samples, self.engine)
        total, rewards = await self._score(outcome)
        samples = tuple(replace(s, reward=r) for s, r in zip(samples, rewards, strict=True))
        trajectory = Trajectory(
            ep.episode, ep.seed, what, (), total, tuple(ep.interruptions), resumed=restarted,
            meta={"finished_at": self.clock.now(), "version_at_finish": self._version, "rollout": self._rollout,
                  "run": run_id, "status": status, "answer": outcome.answer},
            samples=samples)
        if self.redact is None:
            return trajectory
        return Trajectory.from_json(self.redact(trajectory.to_json()), f"episode {ep.episode} redacted")

    async def _run(self, spec: EpisodeSpec, endpoint: Any, run_id: str) -> tuple[str, RunResult | None]:
        """Run the episode's goal or plan on its own endpoint; its status and result (None: cut by the deadline)."""
        from planweave.models.openai import OpenAIChatClient

        if self._http is None:
            raise RolloutError("GoalRollouts runs episodes only inside 'async with'")
        client = OpenAIChatClient(spec.model, **endpoint.client_options(), http=self._http, concurrency=None)
        run = None
        try:
            if spec.goal is not None and spec.planner is not None:
                run = await self._start_goal_with_planner(spec, client, run_id)
            elif spec.goal is not None:
                from planweave.api import start_goal

                run = await start_goal(self.engine, spec.goal, model=client, tools=spec.tools,
                                       budget_usd=spec.budget_usd, budget_tokens=spec.budget_tokens,
                                       deadline=spec.deadline, max_replans=spec.max_replans, run_id=run_id)
            else:
                run = await self._start_plan(spec, client, run_id)
            try:
                async with asyncio.timeout(spec.deadline):
                    result = await run.wait()
            except TimeoutError:
                run.cancel(f"episode deadline of {spec.deadline:g}s")
                with contextlib.suppress(Exception):
                    await run.wait()
                return "deadline", None
            return str(result.status), result
        except asyncio.CancelledError:
            if run is not None and not run.finished:
                run.cancel("rollout episode dropped")
            raise

    async def _start_goal_with_planner(self, spec: EpisodeSpec, client: Any, run_id: str) -> Any:
        """The goal planned by ``spec.planner``, its ``llm`` steps on the policy's ``client``, one budget."""
        from planweave.limits import RunLimits
        from planweave.planning import build_planning_loop
        from planweave.planning.goal import launch_goal
        from planweave.tools.builtins import builtin_tools
        from planweave.tools.llm import llm_tool

        assert spec.goal is not None and spec.planner is not None
        limits = RunLimits(spec.budget_usd, spec.budget_tokens, spec.deadline, spec.max_replans)
        spend = limits.budget()
        base = spec.tools if spec.tools is not None else builtin_tools()
        tools = base.merged({"llm": llm_tool(client, spend)})  # a catalog with its own llm keeps it
        loop = build_planning_loop(self.engine, spec.planner, tools, limits, budget=spend)
        return await launch_goal(loop, spec.goal, run_id=run_id)

    async def _start_plan(self, spec: EpisodeSpec, client: Any, run_id: str) -> Any:
        from planweave.limits import RunLimits
        from planweave.tools.builtins import builtin_tools
        from planweave.tools.llm import llm_tool

        budget = RunLimits(spec.budget_usd, spec.budget_tokens, spec.deadline).budget()
        base = spec.tools if spec.tools is not None else builtin_tools()
        tools = base.merged({"llm": llm_tool(client, budget)})
        assert spec.plan is not None
        return await self.engine.start(spec.plan, tools=tools, run_id=run_id)

    async def _score(self, outcome: EpisodeOutcome) -> tuple[float, list[float]]:
        """The episode's reward and each sample's: the hook's number shared by every call, or its one number per
        call (the episode's is then their sum); a wrong count is an error naming the episode."""
        n = len(outcome.samples)
        if self.episode_reward is None:
            value = 1.0 if outcome.status == "succeeded" else 0.0
            return value, [value] * n
        got: Any = self.episode_reward(outcome)
        if inspect.isawaitable(got):
            got = await got
        if isinstance(got, int | float):
            return float(got), [float(got)] * n
        values = [float(x) for x in got]
        if len(values) != n:
            raise RolloutError(f"episode {outcome.episode}: the reward hook gave {len(values)} rewards for {n} "
                               f"model calls (give one number, or one per call)")
        return sum(values), values


def samples_of(trajectories: Sequence[Trajectory] | Any, *, trainable_only: bool = True) -> list[Sample]:
    """The samples of delivered trajectories in order (only the trainable ones unless ``trainable_only=False``)."""
    return [s for t in trajectories for s in t.samples if s.trainable or not trainable_only]
