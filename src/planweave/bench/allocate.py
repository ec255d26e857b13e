"""``planweave bench allocate``: which tier and how many samples per step, under budgets and deadlines.

Seeded synthetic workflows shaped like the seed's CodeFlow (a spec, modules written in parallel, integration, tests:
``select: first_valid``, a module is done when one sample passes its check) and ProofFlow (lemmas in chains and
branches, then the theorem: ``select: vote``, a lemma is done when most samples agree). Every step is an ``llm``
step with ``model: auto``, ``tiers: [small, medium, large]`` and ``samples: auto`` (1-3) and two retries; each has
a difficulty in [0, 1] and a size in [0.5, 2], drawn from the seed. At tier ``t`` one call succeeds with
``p_t ** (1 + 3 * difficulty)`` and takes a lognormal ``median_t * size`` seconds; it costs ``cost_t * size``.

The runs go through the real engine on the virtual clock, the real ``llm`` tool (its budget reservations, parallel
samples and select rules) and the allocator; the model is :class:`SyntheticModel`, a :class:`ModelClient` that
samples each call's outcome from the step's declared distribution (no HTTP). Per budget and deadline (multiples of
the workflow's reference: the expected cost and the critical path of the medium tier), from loose to tight, it
prints the fraction of runs that succeeded within both, for four policies of the same seam: always the cheapest
tier, always the strongest, greedy per step (the cheapest choice whose own success probability reaches 0.95) and
the Monte Carlo allocator; the allocator's own wall time per decision; and how well the P(all) it predicts at a
run's first decision matches what happens (Brier score, predicted vs observed per fifth of [0, 1]). Runs are
paired: run ``i`` of every policy is the same workflow, under the same budget and deadline.

The calibration of the Monte Carlo allocator's forecast is also measured over ``calibration_runs`` runs (default
:data:`CALIBRATION_RUNS`): its runs in the table count, and more are run (further seeds, shapes and settings in
turn) until there are that many; per tenth of [0, 1] it reports predicted vs observed frequency and whether they
agree within two standard errors of the observed frequency (``sqrt(p (1 - p) / n)`` at the predicted ``p``).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, cast

import typer

from planweave.allocate import POLICIES, AllocationSeam, Allocator, Policy, TierProfile, TierTable
from planweave.bench.cli import parse_command_line
from planweave.core.clock import VirtualClock, run_virtual
from planweave.core.context import current_step
from planweave.core.plan.model import Step
from planweave.models import Budget, Chunk, Completion, CompletionRequest, Delta, MalformedOutput, PriceTable
from planweave.models.pricing import Price

__all__ = ["BASE_TIERS", "Cell", "SyntheticModel", "main", "run_bench", "workflow"]

Shape = Literal["codeflow", "proofflow"]
SHAPES: tuple[Shape, ...] = ("codeflow", "proofflow")

BASE_TIERS = TierTable({
    "small": TierProfile("small", "syn-small", p_success=0.75, duration_s=2.0, cost_usd=0.002, duration_sigma=0.4,
                         tokens=200),
    "medium": TierProfile("medium", "syn-medium", p_success=0.88, duration_s=5.0, cost_usd=0.01,
                          duration_sigma=0.4, tokens=200),
    "large": TierProfile("large", "syn-large", p_success=0.97, duration_s=12.0, cost_usd=0.05, duration_sigma=0.4,
                         tokens=200),
})
PRICES = PriceTable({t.model: Price(input=0.0, output=t.cost_usd / t.tokens * 1e6) for t in BASE_TIERS.tiers.values()})
RETRIES = 2
CALIBRATION_RUNS = 1000
"""Runs of the Monte Carlo allocator behind its calibration (predicted P(all) vs observed frequency, Brier)."""
SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("loose", 4.0, 4.0), ("moderate", 2.0, 2.0), ("tight", 1.0, 1.0), ("tight budget", 0.6, 4.0),
    ("tight deadline", 4.0, 0.6),
)


@dataclass(frozen=True, slots=True)
class WorkStep:
    """A step of a synthetic workflow: what it waits for, how hard and how big it is."""

    id: str
    after: tuple[str, ...]
    difficulty: float
    size: float

    def table(self) -> TierTable:
        """The tiers as they behave on this step."""
        return TierTable({name: TierProfile(
            name, t.model, p_success=t.p_success ** (1.0 + 3.0 * self.difficulty), duration_s=t.duration_s * self.size,
            cost_usd=t.cost_usd * self.size, duration_sigma=t.duration_sigma, tokens=math.ceil(t.tokens * self.size),
        ) for name, t in BASE_TIERS.tiers.items()})


def workflow(shape: Shape, seed: int) -> list[WorkStep]:
    """A seeded workflow of the shape: CodeFlow (spec, 3-5 modules in parallel, integrate, tests) or ProofFlow
    (two or three chains of 2-3 lemmas, then the theorem)."""
    rng = random.Random(f"{shape}/{seed}")

    def step(sid: str, after: Sequence[str]) -> WorkStep:
        return WorkStep(sid, tuple(after), round(rng.random(), 3), round(rng.uniform(0.5, 2.0), 3))

    if shape == "codeflow":
        steps = [step("spec", [])]
        modules = [f"module_{j}" for j in range(rng.randint(3, 5))]
        steps += [step(m, ["spec"]) for m in modules]
        steps += [step("integrate", modules), step("tests", ["integrate"])]
        return steps
    steps = []
    ends = []
    for c in range(rng.randint(2, 3)):
        prev: list[str] = []
        for j in range(rng.randint(2, 3)):
            sid = f"lemma_{c}_{j}"
            steps.append(step(sid, prev))
            prev = [sid]
        ends += prev
    steps.append(step("theorem", ends))
    return steps


def plan_of(steps: Sequence[WorkStep], shape: Shape) -> dict[str, Any]:
    select = "first_valid" if shape == "codeflow" else "vote"
    schema = {"type": "object", "properties": {"answer": {"const": "ok"}}, "required": ["answer"]}
    return {"steps": [{
        "id": s.id, "tool": "llm", "after": list(s.after), "retries": {"max": RETRIES, "backoff": 0.5},
        "args": {"prompt": f"{s.id}: do it", "model": "auto", "tiers": list(BASE_TIERS.tiers), "samples": "auto",
                 "max_samples": 3, "select": select, "schema": schema,
                 "max_tokens": max(t.tokens for t in s.table().tiers.values())},
    } for s in steps]}


def reference(steps: Sequence[WorkStep]) -> tuple[float, float]:
    """The medium tier's expected cost (attempts included) and critical path: what budgets and deadlines scale."""
    cost = 0.0
    finish: dict[str, float] = {}
    for s in steps:
        medium = s.table()["medium"]
        cost += medium.cost_usd / max(medium.p_success, 0.05)
        finish[s.id] = medium.duration_s + max((finish[a] for a in s.after), default=0.0)
    return cost, max(finish.values())


class SyntheticModel:
    """A :class:`ModelClient` whose every call samples its outcome from the calling step's declared profile.

    A valid call streams its tokens over its duration and returns ``{"answer": "ok"}``; an invalid one streams as
    long, then fails as a reply not matching the schema (:class:`MalformedOutput`). Priced by :data:`PRICES`, so
    a cut stream is charged for the share it sent.
    """

    def __init__(self, tables: Mapping[tuple[str, str], TierTable], seed: int) -> None:
        self._tables = tables
        self._seed = seed
        self._nth: dict[tuple[str, int, str], int] = {}
        self.calls = 0

    @property
    def model(self) -> str:
        return "syn-small"

    async def complete(self, request: CompletionRequest) -> Completion:
        completion: Completion | None = None
        async for chunk in self.stream(request):
            if isinstance(chunk, Completion):
                completion = chunk
        assert completion is not None
        return completion

    async def stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        ctx = current_step()
        table = self._tables[(ctx.run_id, ctx.step_id)]
        model = request.model or self.model
        profile = next(t for t in table.tiers.values() if t.model == model)
        self.calls += 1
        # The luck of a call is keyed by the run, step, attempt, model and sample, not by the order of calls: the
        # same run replays whatever order its steps' calls start in.
        key = (ctx.step_id, ctx.attempt, model)
        nth = self._nth[key] = self._nth.get(key, -1) + 1
        rng = random.Random(f"{self._seed}/{ctx.run_id}/{ctx.step_id}/{ctx.attempt}/{model}/{nth}")
        valid = rng.random() < profile.p_success
        seconds = profile.duration_s * math.exp(profile.duration_sigma * rng.gauss(0.0, 1.0))
        pieces = 4
        per_piece = "x" * (4 * profile.tokens // pieces)  # four characters a token
        for _ in range(pieces):
            await asyncio.sleep(seconds / pieces)
            yield Delta(per_piece)
        if not valid:
            raise MalformedOutput(f"model '{model}': the reply does not match the schema", model=model,
                                  base_url="synthetic://", text="nope")
        yield Completion(text='{"answer": "ok"}', model=model, prompt_tokens=0, completion_tokens=profile.tokens,
                         usage_source="server", cost_usd=profile.cost_usd, parsed={"answer": "ok"},
                         duration_s=seconds)


@dataclass(frozen=True, slots=True)
class Cell:
    """One policy under one budget and deadline: runs, how many finished within both, spend, decisions."""

    shape: str
    setting: str
    budget_x: float
    deadline_x: float
    policy: str
    runs: int
    completed: int
    fraction: float
    mean_cost_usd: float
    decisions: int
    overhead_ms_p50: float
    overhead_ms_p90: float


async def _one_run(shape: Shape, seed: int, budget_x: float, deadline_x: float, policy: Policy, sims: int
                   ) -> tuple[bool, float, list[float], float | None]:
    from planweave import Toolbox, open_engine
    from planweave.engine.runtime import cancel_at_deadline
    from planweave.tools.llm import llm_tool

    steps = workflow(shape, seed)
    ref_cost, ref_time = reference(steps)
    budget_usd, deadline_s = ref_cost * budget_x, ref_time * deadline_x
    run_id = f"{shape}-{seed}"
    tables = {(run_id, s.id): s.table() for s in steps}
    by_step = {s.id: tables[(run_id, s.id)] for s in steps}
    model = SyntheticModel(tables, seed)
    budget = Budget(usd=budget_usd)
    clock = VirtualClock()

    def step_table(step: Step) -> TierTable | None:
        return by_step.get(step.id)

    seam = AllocationSeam(BASE_TIERS, allocator=Allocator(BASE_TIERS, sims=sims, seed=seed), policy=policy,
                          step_table=step_table, deadline_at=asyncio.get_running_loop().time() + deadline_s)
    tools = Toolbox({"llm": llm_tool(model, budget, prices=PRICES, allocation=seam)})
    async with open_engine("memory://", clock=clock, concurrency=None, tools=tools) as engine:
        seam.bind(engine.get)
        run = await engine.start(plan_of(steps, shape), run_id=run_id)
        cancel_at_deadline(engine, run, deadline_s)
        result = await run.wait()
    ok = result.ok and budget.spent_usd <= budget_usd + 1e-12
    first = seam.decisions[0].estimate.p_all if seam.decisions else None  # the forecast made before anything ran
    return ok, budget.spent_usd, [d.overhead_s for d in seam.decisions], first


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_bench(*, runs: int, shapes: Sequence[Shape], policies: Sequence[Policy], sims: int,
              settings: Sequence[tuple[str, float, float]] = SETTINGS, seed: int = 0,
              calibration_runs: int = 0) -> dict[str, Any]:
    """Run every policy on ``runs`` workflows of each shape under every setting; return the cells and overheads,
    and (``calibration_runs`` > 0) the Monte Carlo allocator's calibration over that many runs."""
    cells: list[Cell] = []
    overheads: dict[str, list[float]] = {p: [] for p in policies}
    forecasts: dict[str, list[tuple[float, bool]]] = {p: [] for p in policies}
    started = time.perf_counter()
    for shape in shapes:
        for name, bx, dx in settings:
            for policy in policies:
                done = 0
                costs: list[float] = []
                cell_overheads: list[float] = []
                for i in range(runs):
                    ok, cost, spent, first = run_virtual(_one_run(shape, seed + i, bx, dx, policy, sims))
                    if first is not None:
                        forecasts[policy].append((first, ok))
                    done += ok
                    costs.append(cost)
                    cell_overheads += spent
                overheads[policy] += cell_overheads
                cells.append(Cell(shape, name, bx, dx, policy, runs, done, done / runs, statistics.fmean(costs),
                                  len(cell_overheads), 1000 * _quantile(cell_overheads, 0.5),
                                  1000 * _quantile(cell_overheads, 0.9)))
    table_s = time.perf_counter() - started
    calibrated = _calibration_runs(calibration_runs, forecasts.get("monte_carlo", []), shapes, settings, sims,
                                   seed + runs) if calibration_runs > 0 else None
    return {
        "runs": runs, "sims": sims, "seed": seed, "wall_s": round(time.perf_counter() - started, 2),
        "table_wall_s": round(table_s, 2),
        **({"calibration_runs": calibrated} if calibrated is not None else {}),
        "cells": [asdict(c) for c in cells],
        "overhead_ms": {p: {"decisions": len(v), "p50": round(1000 * _quantile(v, 0.5), 3),
                            "p90": round(1000 * _quantile(v, 0.9), 3),
                            "mean": round(1000 * statistics.fmean(v), 3) if v else 0.0}
                        for p, v in overheads.items()},
        "calibration": {p: calibration(v) for p, v in forecasts.items()},
    }


def _calibration_runs(total: int, have: Sequence[tuple[float, bool]], shapes: Sequence[Shape],
                      settings: Sequence[tuple[str, float, float]], sims: int, seed: int) -> dict[str, Any]:
    """The Monte Carlo allocator's calibration over ``total`` runs: ``have`` (the table's), then runs of further
    seeds from ``seed``, each seed over every shape and setting in turn, until there are ``total``."""
    started = time.perf_counter()
    pairs = list(have[:total])
    extra = k = 0
    combos = [(shape, bx, dx) for shape in shapes for _, bx, dx in settings]
    while len(pairs) < total:
        shape, bx, dx = combos[k % len(combos)]
        ok, _, _, first = run_virtual(_one_run(shape, seed + k // len(combos), bx, dx, "monte_carlo", sims))
        k += 1
        extra += 1
        if first is not None:
            pairs.append((first, ok))
    return {"from_table": min(len(have), total), "extra_runs": extra,
            "wall_s": round(time.perf_counter() - started, 2), **calibration(pairs, bins=10)}


def calibration(pairs: Sequence[tuple[float, bool]], bins: int = 5) -> dict[str, Any]:
    """The allocator's own forecast (P(all) of the plan it allocated, at the run's first decision) against what
    happened: Brier score, mean predicted vs observed, and per ``bins``-th of [0, 1] (with whether the observed
    frequency is within two standard errors of the predicted probability)."""
    if not pairs:
        return {"runs": 0}
    brier = statistics.fmean((p - ok) ** 2 for p, ok in pairs)
    found = []
    for b in range(bins):
        inside = [(p, ok) for p, ok in pairs if min(bins - 1, int(p * bins)) == b]
        if inside:
            predicted = statistics.fmean(p for p, _ in inside)
            observed = statistics.fmean(ok for _, ok in inside)
            se = math.sqrt(max(predicted * (1.0 - predicted), 1e-12) / len(inside))
            found.append({"p_lo": round(b / bins, 3), "p_hi": round((b + 1) / bins, 3), "runs": len(inside),
                          "predicted": round(predicted, 3), "observed": round(observed, 3),
                          "within_2se": abs(observed - predicted) <= 2.0 * se})
    bins_out = found
    mean = statistics.fmean(ok for _, ok in pairs)
    return {"runs": len(pairs), "brier": round(brier, 4),
            "brier_base": round(mean * (1.0 - mean), 4),  # always forecasting the observed mean frequency
            "predicted": round(statistics.fmean(p for p, _ in pairs), 3),
            "observed": round(mean, 3), "bins": bins_out}


def render(result: Mapping[str, Any]) -> str:
    """The table: per shape and setting, the fraction completed within budget and deadline per policy."""
    cells = result["cells"]
    policies = list(dict.fromkeys(c["policy"] for c in cells))
    lines = [f"{result['runs']} runs per cell, {result['sims']} simulated runs per decision, "
             f"{result['wall_s']}s", ""]
    header = f"{'shape':<10} {'setting':<15} {'budget':>6} {'deadline':>8} " + " ".join(f"{p:>12}" for p in policies)
    lines += [header, "-" * len(header)]
    rows: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for c in cells:
        rows.setdefault((c["shape"], c["setting"]), {})[c["policy"]] = c
    for (shape, setting), by_policy in rows.items():
        any_cell = next(iter(by_policy.values()))
        lines.append(f"{shape:<10} {setting:<15} {any_cell['budget_x']:>5}x {any_cell['deadline_x']:>7}x "
                     + " ".join(f"{by_policy[p]['fraction']:>12.2f}" for p in policies if p in by_policy))
    lines.append("")
    for policy, o in result["overhead_ms"].items():
        lines.append(f"overhead per decision, {policy}: p50 {o['p50']:.1f} ms, p90 {o['p90']:.1f} ms "
                     f"({o['decisions']} decisions)")
    for policy, c in result.get("calibration", {}).items():
        if c.get("runs"):
            lines.append(f"forecast at the first decision, {policy}: P(all) {c['predicted']:.2f} predicted, "
                         f"{c['observed']:.2f} observed, Brier {c['brier']:.3f} ({c['runs']} runs)")
    cal = result.get("calibration_runs")
    if cal and cal.get("runs"):
        lines += ["", f"calibration, monte_carlo, {cal['runs']} runs ({cal['from_table']} from the table, "
                      f"{cal['extra_runs']} more, {cal['wall_s']}s): Brier {cal['brier']:.3f} "
                      f"(always the mean: {cal['brier_base']:.3f}), P(all) {cal['predicted']:.3f} predicted, "
                      f"{cal['observed']:.3f} observed",
                  f"{'P(all) bin':<12} {'runs':>5} {'predicted':>9} {'observed':>8}  within 2 SE"]
        for b in cal["bins"]:
            lines.append(f"{b['p_lo']:.1f}-{b['p_hi']:.1f}     {b['runs']:>5} {b['predicted']:>9.3f} "
                         f"{b['observed']:>8.3f}  {'yes' if b['within_2se'] else 'no'}")
    return "\n".join(lines)


def _command(
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs per shape, setting and policy.")] = 20,
    shapes: Annotated[str, typer.Option("--shapes", help="Comma-separated: codeflow, proofflow.")
                      ] = "codeflow,proofflow",
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated: " + ", ".join(POLICIES) + ".")
                        ] = ",".join(("cheapest", "strongest", "greedy", "monte_carlo")),
    sims: Annotated[int, typer.Option("--sims", min=1, help="Simulated runs per allocator decision.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="The first workflow's seed.")] = 0,
    calibration_runs: Annotated[int, typer.Option(
        "--calibration-runs", min=0, help="Runs of the Monte Carlo allocator behind its calibration (its table "
        "runs count; more are run to reach this many; 0: the table's only).")] = CALIBRATION_RUNS,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[dict[str, Any], bool]:
    """Cheapest, strongest, greedy and Monte Carlo allocation of synthetic CodeFlow/ProofFlow runs on the virtual
    clock, from loose to tight budgets and deadlines."""
    shape_list = [s.strip() for s in shapes.split(",") if s.strip()]
    for s in shape_list:
        if s not in SHAPES:
            raise typer.BadParameter(f"unknown shape '{s}' (shapes: {', '.join(SHAPES)})", param_hint="--shapes")
    policy_list = [p.strip() for p in policies.split(",") if p.strip()]
    for p in policy_list:
        if p not in POLICIES:
            raise typer.BadParameter(f"unknown policy '{p}' (policies: {', '.join(POLICIES)})",
                                     param_hint="--policies")
    result = run_bench(runs=runs, shapes=cast(list[Shape], shape_list), policies=cast(list[Policy], policy_list),
                       sims=sims, seed=seed, calibration_runs=calibration_runs)
    return result, json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench allocate")
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
