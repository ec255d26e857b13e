"""How true a forecast's chance of success is: Brier scores on held-out runs (``planweave bench forecast``).

Seeded plans of 4 to 8 steps over tools with known behaviour (``ok`` never fails, ``coin`` fails with its step's
``p_fail``, ``first_fails`` fails every first attempt and succeeds on a retry), each step with 0 to 2 retries, run on
the engine on the virtual clock: ``train_runs`` runs of each plan make the history, then each plan is forecast once
from it and scored against the outcomes of ``test_runs`` further runs the forecast was not fitted on. The Brier score
(mean squared difference between the forecast chance and the outcome, 0 or 1; lower is better) is compared with:

- ``naive``: the share of training runs, over every plan, that succeeded (one number for all plans);
- ``plan_rate``: each plan's own training success rate, Laplace-smoothed ((s + 1) / (n + 2));
- ``unseen``: each plan forecast from the other plans' runs only (what its tools did elsewhere), as for a plan
  that never ran; against the same baselines;
- ``flat``: the earlier model, a uniform Beta prior per attempt key (the step's fingerprint once it repeats, else
  its tool), every attempt alike (no pooling, retries not told apart).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line
from planweave.core.clock import VirtualClock, run_virtual
from planweave.core.context import current_step
from planweave.core.errors import ToolError
from planweave.core.events import Event
from planweave.core.plan.graph import Plan, parse_plan_document, validate_plan
from planweave.engine.runtime import Engine
from planweave.forecast.estimates import Estimates, StepModel
from planweave.forecast.history import estimates_from_events
from planweave.forecast.simulate import forecast
from planweave.journal import MemoryJournal
from planweave.tools.registry import Toolbox


class Draws:
    """Each attempt's failure draw, keyed by (seed, plan, run, step, attempt): the same whatever order concurrent
    steps run in."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.plan = 0
        self.run = 0

    def uniform(self) -> float:
        ctx = current_step()
        return random.Random(f"{self.seed}/{self.plan}/{self.run}/{ctx.step_id}/{ctx.attempt}").random()


def bench_tools(draws: Draws) -> Toolbox:
    """The benchmark's tools, drawing their failures from ``draws``."""
    box = Toolbox()

    async def ok(n: int = 0) -> dict[str, int]:
        """Never fails."""
        return {"n": n}

    async def coin(p_fail: float, n: int = 0) -> dict[str, int]:
        """Fails with probability ``p_fail``."""
        if draws.uniform() < p_fail:
            raise ToolError("coin came up failed")
        return {"n": n}

    async def first_fails(n: int = 0) -> dict[str, int]:
        """Fails on a step's first attempt, succeeds on its retries."""
        if current_step().attempt == 1:
            raise ToolError("first attempt fails")
        return {"n": n}

    box.add(ok, idempotent=True)
    box.add(coin, idempotent=True)
    box.add(first_fails, idempotent=True)
    return box


def random_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """A plan of 4 to 8 steps, each after some earlier ones, with a tool, a failure rate and retries."""
    steps: list[dict[str, Any]] = []
    for i in range(rng.randint(4, 8)):
        kind = rng.choices(["ok", "coin", "first_fails"], weights=[5, 4, 1])[0]
        args: dict[str, Any] = {"n": i}
        retries = rng.choice([0, 0, 1, 2])
        if kind == "coin":
            args["p_fail"] = rng.choice([0.02, 0.1, 0.3])
        if kind == "first_fails":
            retries = max(1, retries)
        after = sorted({f"s{j}" for j in range(i) if rng.random() < 0.3})
        steps.append({"id": f"s{i}", "tool": kind, "args": args, "retries": retries, "after": after})
    return {"name": f"cal{index}", "steps": steps}


def flat_overrides(plan: Plan, table: Estimates) -> dict[str, StepModel]:
    """The earlier model: each step's success the Beta(1, 1) mean of its key's attempts, retries alike."""
    out: dict[str, StepModel] = {}
    for sid in plan.order:
        step = plan.steps[sid]
        found = table.history_of(step, plan.fingerprints[sid])
        model = table.step_model(step, plan.fingerprints[sid])
        out[sid] = StepModel(model.duration, found.success.mean if found else 1.0, model.cost_usd)
    return out


@dataclass(frozen=True)
class Calibration:
    """Brier scores on held-out runs (lower is better) and what they were computed over."""

    plans: int
    train_runs: int
    test_runs: int
    forecasts: int
    observed: float  # share of held-out runs that succeeded
    mean_forecast: float  # mean forecast chance of success
    brier: float
    brier_naive: float
    brier_plan_rate: float
    brier_flat: float
    brier_unseen: float  # each plan forecast from the other plans' runs only (the tools' history, not its own)
    brier_unseen_flat: float
    bins: Sequence[Mapping[str, float]]  # reliability: forecast bins, their mean forecast and observed rate


def _brier(pairs: Sequence[tuple[float, bool]]) -> float:
    return sum((p - float(o)) ** 2 for p, o in pairs) / len(pairs)


def _bins(pairs: Sequence[tuple[float, bool]]) -> list[dict[str, float]]:
    out = []
    for low in (0.0, 0.2, 0.4, 0.6, 0.8):
        inside = [(p, o) for p, o in pairs if low <= p < low + 0.2 or (low == 0.8 and p == 1.0)]
        if inside:
            out.append({"from": low, "to": round(low + 0.2, 1), "n": len(inside),
                        "forecast": round(sum(p for p, _ in inside) / len(inside), 3),
                        "observed": round(sum(o for _, o in inside) / len(inside), 3)})
    return out


def calibration(*, plans: int = 20, train_runs: int = 10, test_runs: int = 20, seed: int = 0,
                forecast_runs: int = 2000) -> Calibration:
    """Run the benchmark (module docstring): deterministic for a given ``seed``."""
    rng = random.Random(seed)
    draws = Draws(seed)
    tools = bench_tools(draws)
    docs = [random_plan(rng, i) for i in range(plans)]

    async def outcomes(doc: dict[str, Any], n: int) -> tuple[list[bool], list[Event]]:
        got = []
        journal = MemoryJournal()
        async with Engine(journal, clock=VirtualClock(), tools=tools) as engine:
            for _ in range(n):
                draws.run += 1
                run = await engine.start(doc)
                got.append((await run.wait()).status == "succeeded")
            return got, await journal.read()

    histories: list[list[Event]] = []
    tests: list[list[bool]] = []
    plans_of: list[Plan] = []
    ours: list[tuple[float, bool]] = []
    flat: list[tuple[float, bool]] = []
    rate: list[tuple[float, bool]] = []
    held: list[bool] = []
    trained: list[bool] = []
    for index, doc in enumerate(docs):
        draws.plan = index
        train, history = run_virtual(outcomes(doc, train_runs))
        trained += train
        table = estimates_from_events(history)
        plan = validate_plan(parse_plan_document(doc), tools)
        p = forecast(plan, table, runs=forecast_runs, seed=seed).p_success
        p_flat = forecast(plan, table, runs=forecast_runs, seed=seed, overrides=flat_overrides(plan, table)).p_success
        p_rate = (sum(train) + 1) / (len(train) + 2)
        test, _ = run_virtual(outcomes(doc, test_runs))
        histories.append(history)
        tests.append(test)
        plans_of.append(plan)
        held += test
        ours += [(p, o) for o in test]
        flat += [(p_flat, o) for o in test]
        rate += [(p_rate, o) for o in test]
    base = sum(trained) / len(trained)
    unseen: list[tuple[float, bool]] = []
    unseen_flat: list[tuple[float, bool]] = []
    for i, plan in enumerate(plans_of):
        others = estimates_from_events([e for j, h in enumerate(histories) if j != i for e in h])
        p = forecast(plan, others, runs=forecast_runs, seed=seed).p_success
        p_flat = forecast(plan, others, runs=forecast_runs, seed=seed,
                          overrides=flat_overrides(plan, others)).p_success
        unseen += [(p, o) for o in tests[i]]
        unseen_flat += [(p_flat, o) for o in tests[i]]
    return Calibration(
        plans=plans, train_runs=train_runs, test_runs=test_runs, forecasts=len(ours),
        observed=round(sum(held) / len(held), 4), mean_forecast=round(sum(p for p, _ in ours) / len(ours), 4),
        brier=round(_brier(ours), 4), brier_naive=round(_brier([(base, o) for o in held]), 4),
        brier_plan_rate=round(_brier(rate), 4), brier_flat=round(_brier(flat), 4),
        brier_unseen=round(_brier(unseen), 4), brier_unseen_flat=round(_brier(unseen_flat), 4), bins=_bins(ours),
    )


def render(c: Calibration) -> str:
    lines = [f"forecast calibration: {c.plans} plans, {c.train_runs} training runs each, {c.test_runs} held-out "
             f"runs each ({c.forecasts} scored outcomes; {c.observed:.0%} succeeded, mean forecast "
             f"{c.mean_forecast:.0%})",
             f"Brier (lower is better): forecast {c.brier:.4f}  naive base rate {c.brier_naive:.4f}  "
             f"plan's own rate {c.brier_plan_rate:.4f}  flat prior per attempt {c.brier_flat:.4f}",
             f"a plan never run (forecast from the other plans' runs): forecast {c.brier_unseen:.4f}  flat prior "
             f"{c.brier_unseen_flat:.4f}  naive base rate {c.brier_naive:.4f}",
             "reliability: " + "  ".join(f"[{b['from']:.1f},{b['to']:.1f}) n={b['n']:.0f} forecast "
                                         f"{b['forecast']:.2f} observed {b['observed']:.2f}" for b in c.bins)]
    return "\n".join(lines)


def _command(
    plans: Annotated[int, typer.Option("--plans", min=1, help="Seeded plans.")] = 20,
    train_runs: Annotated[int, typer.Option("--train-runs", min=1, help="Runs per plan the history is made of.")
                          ] = 10,
    test_runs: Annotated[int, typer.Option("--test-runs", min=1, help="Held-out runs per plan scored.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the plans, failures and simulations.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[Calibration, bool]:
    """Brier scores of the forecast's chance of success on held-out runs, against naive baselines."""
    return calibration(plans=plans, train_runs=train_runs, test_runs=test_runs, seed=seed), json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its summary (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench forecast")
    print(json.dumps(asdict(result), indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
