"""The control-loop benchmark (``planweave bench control``): synchronous vs asynchronous inference with
``drop_expired`` and ``rollforward`` realignment, for inference latencies of 50, 150 and 400 ms.

Both simulated environments of :mod:`planweave.control.envs` (the point robot tracking a circling target, pushed
every 2.5 s; gymnasium's cart-pole, its pole kicked every 2 s), at 50 Hz with chunks of 32 actions, 8 executed per
chunk before the next is asked for, run on the virtual clock (so the latencies are exact and the table is
deterministic), each over ``--seeds`` seeds. The policy's latency is ``L ± 10 %``.

Per (environment, latency, mode): ``success`` (share of seeds: the point within 0.3 m of the target 75 % of the
time; the pole up for the whole episode), ``tracking_error`` (mean distance to the target in m; mean |pole angle| in
rad), ``reaction_s`` (mean time from a disturbance to the first action of a chunk inferred from an observation
after it), ``idle_frac`` (share of ticks holding the safe action), ``discarded`` (actions of arrived chunks dropped
as expired or refused, per run). ``--plot PATH`` writes the point robot's tracking error over time (PNG).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from planweave.bench.cli import parse_command_line
from planweave.control.envs import (
    CartPole,
    PointTracking,
    SimulatedPolicy,
    cart_model,
    cart_planner,
    point_model,
    point_planner,
)
from planweave.control.loop import ControlLoop, ControlReport
from planweave.core.clock import run_virtual
from planweave.extras import installed

__all__ = ["main", "run_bench", "run_one"]

BenchMode = Literal["sync", "drop_expired", "rollforward"]
MODES: tuple[BenchMode, ...] = ("sync", "drop_expired", "rollforward")
LATENCIES_MS = (50, 150, 400)
RATE_HZ, HORIZON, EXECUTE = 50.0, 32, 8


@dataclass
class Outcome:
    """One episode: the environment's own measures and the loop's report."""

    success: bool
    tracking_error: float
    reaction_s: float | None
    idle_frac: float
    discarded: int
    errors: list[tuple[float, float]]
    report: ControlReport


def reaction_times(report: ControlReport, disturbed_ticks: Sequence[int], dt: float) -> list[float]:
    """For each disturbance, the time to the first action run from a chunk inferred after it."""
    observed = {s.chunk: s.observed_tick for s in report.splices if not s.refused}
    out = []
    for tick in disturbed_ticks:
        for record in report.trace:
            if record.tick > tick and record.chunk is not None and observed.get(record.chunk, -1) > tick:
                out.append((record.tick - tick) * dt)
                break
    return out


def jump_monitor(env_name: str) -> Callable[[Any], bool]:
    """A disturbance detector: the point moved farther in one tick than it can (0.1 m), or the pole's angular
    velocity changed by more than 0.4 rad/s in one tick."""
    previous: list[Any] = []

    def monitor(obs: Any) -> bool:
        last = previous[-1] if previous else None
        previous[:] = [obs]
        if last is None:
            return False
        if env_name == "point":
            return bool(abs(obs.x - last.x) + abs(obs.y - last.y) > 0.1)
        return bool(abs(obs.theta_dot - last.theta_dot) > 0.4)

    return monitor


def run_one(env_name: str, latency_ms: int, mode: BenchMode, seed: int, *, monitor: bool = False) -> Outcome:
    """One episode of ``env_name`` (``point`` | ``cartpole``) with the policy's latency and the loop's mode;
    ``monitor``: asynchronous modes ask for a chunk at once when a disturbance is detected."""
    dt = 1.0 / RATE_HZ
    env: PointTracking | CartPole
    planner: Callable[[Any, int, float], Sequence[Any]]
    model: Callable[[Any, Any], Any]
    safe: Any
    if env_name == "point":
        env = PointTracking(seed=seed)
        planner, safe = point_planner, (0.0, 0.0)
        model = lambda obs, action: point_model(obs, action, dt)  # noqa: E731
    else:
        env = CartPole(seed=seed)
        planner, safe = cart_planner, 0.0
        model = lambda obs, action: cart_model(obs, action, dt)  # noqa: E731
    latency = latency_ms / 1000
    policy = SimulatedPolicy(planner, latency_s=latency, jitter_s=latency / 10, seed=seed)
    loop = ControlLoop(env=env, policy=policy, rate_hz=RATE_HZ, horizon=HORIZON, execute=EXECUTE,
                       realign="drop_expired" if mode == "sync" else mode, model=model,
                       mode="sync" if mode == "sync" else "async", safe_action=safe, latency_hint_s=latency,
                       monitor=jump_monitor(env_name) if monitor and mode != "sync" else None)
    report = run_virtual(loop.run(until=lambda obs: obs.done, deadline=60.0))
    reactions = reaction_times(report, env.disturbed_ticks, dt)
    return Outcome(env.success(), env.tracking_error(), statistics.fmean(reactions) if reactions else None,
                   report.idle_frac, report.discarded, env.errors, report)


def run_bench(seeds: int, envs: Sequence[str], monitor: bool = False) -> dict[str, Any]:
    rows = []
    for env_name in envs:
        for latency_ms in LATENCIES_MS:
            for mode in MODES:
                runs = [run_one(env_name, latency_ms, mode, seed, monitor=monitor) for seed in range(seeds)]
                reactions = [r.reaction_s for r in runs if r.reaction_s is not None]
                rows.append({
                    "env": env_name, "latency_ms": latency_ms, "mode": mode,
                    "success": sum(r.success for r in runs) / len(runs),
                    "tracking_error": statistics.fmean(r.tracking_error for r in runs),
                    "reaction_s": statistics.fmean(reactions) if reactions else None,
                    "idle_frac": statistics.fmean(r.idle_frac for r in runs),
                    "discarded": statistics.fmean(r.discarded for r in runs),
                })
    return {"settings": {"rate_hz": RATE_HZ, "horizon": HORIZON, "execute": EXECUTE, "seeds": seeds,
                         "jitter": 0.1, "clock": "virtual", "monitor": monitor}, "rows": rows}


def render_table(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [f"control: {s['rate_hz']:g} Hz, chunks of {s['horizon']}, {s['execute']} executed per chunk, latency "
             f"±{100 * s['jitter']:g} %, {s['seeds']} seeds, {s['clock']} clock"
             f"{', disturbance monitor on the async modes' if s['monitor'] else ''}; reaction and error vs sync", "",
             f"{'env':<9} {'lat ms':>6} {'mode':<13} {'success':>7} {'error':>7} {'vs sync':>7} {'reaction s':>10} "
             f"{'vs sync':>7} {'idle':>6} {'discarded':>9}"]
    sync: dict[tuple[str, int], dict[str, Any]] = {}
    for r in result["rows"]:
        if r["mode"] == "sync":
            sync[(r["env"], r["latency_ms"])] = r
        base = sync[(r["env"], r["latency_ms"])]
        err_ratio = r["tracking_error"] / base["tracking_error"] if base["tracking_error"] else float("nan")
        react = "-" if r["reaction_s"] is None else f"{r['reaction_s']:.3f}"
        react_ratio = ("-" if r["reaction_s"] is None or not base["reaction_s"]
                       else f"{r['reaction_s'] / base['reaction_s']:.2f}")
        lines.append(f"{r['env']:<9} {r['latency_ms']:>6} {r['mode']:<13} {r['success']:>7.2f} "
                     f"{r['tracking_error']:>7.3f} {err_ratio:>7.2f} {react:>10} {react_ratio:>7} "
                     f"{r['idle_frac']:>6.3f} {r['discarded']:>9.1f}")
    return "\n".join(lines)


def plot_tracking(path: Path, latencies_ms: Sequence[int] = (150, 400), seed: int = 0) -> None:
    """The point robot's distance to its target over time, in each mode, one panel per latency: a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(latencies_ms), 1, figsize=(8, 2.6 * len(latencies_ms)), dpi=90, sharex=True)
    pushes = [t for t, _, _ in PointTracking(seed=seed).pushes]
    for ax, latency_ms in zip(axes, latencies_ms, strict=True):
        for mode, colour in zip(MODES, ("#c0392b", "#2e86c1", "#27ae60"), strict=True):
            outcome = run_one("point", latency_ms, mode, seed)
            ax.plot([t for t, _ in outcome.errors], [e for _, e in outcome.errors], color=colour, linewidth=1.0,
                    label=f"{mode} (mean {outcome.tracking_error:.3f} m)")
        for t in pushes:
            ax.axvline(t, color="#999999", linewidth=0.6, linestyle=":")
        ax.set_ylabel("distance (m)")
        ax.set_title(f"inference latency {latency_ms} ms", fontsize=9)
        ax.set_ylim(0, 2.0)
        ax.legend(loc="upper center", ncol=3, fontsize=7.5, frameon=False)
    axes[-1].set_xlabel("time (s); dotted: a push of 0.5 m")
    fig.suptitle("Point robot tracking a circling target at 50 Hz: distance to the target", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _command(
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeded episodes per row.")] = 3,
    env: Annotated[str, typer.Option("--env", help="point, cartpole or all.")] = "all",
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the tracking-error plot (PNG) here.")] = None,
    monitor: Annotated[bool, typer.Option("--monitor", help="Asynchronous modes infer at once on a detected "
                                          "disturbance (replacing the inference in flight).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object with the rows.")] = False,
) -> tuple[dict[str, Any], bool]:
    """Synchronous vs asynchronous (drop_expired, rollforward) control at inference latencies of 50, 150, 400 ms."""
    if env not in ("point", "cartpole", "all"):
        raise typer.BadParameter(f"--env '{env}' is not known: use point, cartpole or all")
    envs = ["point", "cartpole"] if env == "all" else [env]
    if "cartpole" in envs and not installed("gymnasium"):
        raise typer.BadParameter("--env cartpole needs the 'control' extra: pip install 'planweave[control]'")
    if plot is not None:
        if not installed("matplotlib"):
            raise typer.BadParameter("--plot needs matplotlib: pip install matplotlib")
        plot_tracking(plot)
    return run_bench(seeds, envs, monitor), json_output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON); exit status 2 for bad options."""
    result, as_json = parse_command_line(_command, argv, "planweave bench control")
    print(json.dumps(result, indent=2) if as_json else render_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
