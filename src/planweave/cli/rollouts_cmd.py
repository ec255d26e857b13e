"""``planweave rollouts run CONFIG.yaml``: episodes against a policy endpoint (``reset/step`` environments, or goal
runs through the rollout gateway with ``episodes_from``), trajectories to a sink."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from planweave.cli.common import JsonOption, clean_errors, print_json

rollouts_app = typer.Typer(help="Agent RL rollouts: trajectories streamed to a sink under a staleness bound.",
                           no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``rollouts`` group to ``app``."""
    app.add_typer(rollouts_app, name="rollouts")


async def _run(path: Path) -> dict[str, Any]:
    from planweave.models.openai import OpenAIChatClient
    from planweave.rollouts import RolloutEngine
    from planweave.rollouts.config import load_config, load_env
    from planweave.rollouts.sinks import open_sink
    from planweave.tools.safety import SecretRedactor

    config = load_config(path)
    if config.episodes_from is not None:
        return await _run_goals(path, config)
    assert config.env is not None  # load_config: env or episodes_from
    env = load_env(config.env, str(path))
    key = os.environ.get(config.policy.api_key_env) if config.policy.api_key_env else "none"
    sink = open_sink(config.sink)
    written = 0
    try:
        async with OpenAIChatClient(config.policy.model, base_url=config.policy.base_url, api_key=key,
                                    concurrency=config.concurrency) as client, \
                RolloutEngine(client, env, max_staleness=config.max_staleness, on_stale=config.on_stale,
                              concurrency=config.concurrency, max_lag_batches=config.max_lag_batches,
                              episodes=config.episodes, max_turns=config.max_turns, seed=config.seed,
                              journal=config.journal, system=config.system, logprobs=config.policy.logprobs,
                              max_tokens=config.policy.max_tokens,
                              temperature=config.policy.temperature,
                              redact=SecretRedactor()) as rollouts:  # as `planweave run`: no secret is stored
            async for batch in rollouts.batches(size=config.batch):
                await sink.write(batch)
                written += len(batch)
                rollouts.ack(batch)  # durable in the sink first, then acknowledged
            stats = rollouts.stats
    finally:
        await sink.close()
    return {"sink": config.sink, "written": written, "started": stats.started, "resumed": stats.resumed,
            "failed": stats.failed, "dropped": stats.dropped_in_flight + stats.dropped_waiting}


async def _run_goals(path: Path, config: Any) -> dict[str, Any]:
    """Goal-run episodes through the gateway in front of the config's policy server, their samples to the sink."""
    from planweave.api import open_engine
    from planweave.rollouts.config import load_callable
    from planweave.rollouts.gateway import Gateway
    from planweave.rollouts.goals import GoalRollouts
    from planweave.rollouts.sinks import open_sink
    from planweave.tools.safety import SecretRedactor

    where = str(path)
    episodes_from = load_callable(config.episodes_from, where, "episodes_from", "my_tasks:episode")
    reward = load_callable(config.reward, where, "reward", "my_tasks:score") if config.reward else None
    key = os.environ.get(config.policy.api_key_env) if config.policy.api_key_env else None
    gateway_config = config.gateway
    sink = open_sink(config.sink)
    written = calls = 0
    try:
        async with Gateway(config.policy.base_url, api_key=key, model=config.policy.model,
                           dialect=gateway_config.dialect if gateway_config else "vllm",
                           chat_format=gateway_config.chat_format if gateway_config else None) as gateway, \
                open_engine("memory://") as engine, \
                GoalRollouts(gateway, engine, episodes_from=episodes_from, reward=reward,
                             max_staleness=config.max_staleness, on_stale=config.on_stale,
                             concurrency=config.concurrency, max_lag_batches=config.max_lag_batches,
                             episodes=config.episodes, seed=config.seed, journal=config.journal,
                             redact=SecretRedactor()) as rollouts:
            async for batch in rollouts.batches(size=config.batch):
                await sink.write(batch)
                written += len(batch)
                calls += sum(len(t.samples) for t in batch)
                rollouts.ack(batch)  # durable in the sink first, then acknowledged
            stats = rollouts.stats
    finally:
        await sink.close()
    return {"sink": config.sink, "written": written, "samples": calls, "started": stats.started,
            "resumed": stats.resumed, "failed": stats.failed,
            "dropped": stats.dropped_in_flight + stats.dropped_waiting, "resampled": rollouts.resampled}


@rollouts_app.command("run")
def run(
    config: Annotated[Path, typer.Argument(help="The rollouts config (YAML).", show_default=False)],
    json_output: JsonOption = False,
) -> None:
    """Run the config's episodes against its policy endpoint and write the trajectories to its sink."""
    with clean_errors(json_output):
        result = asyncio.run(_run(config))
    if json_output:
        print_json(result)
    else:
        typer.echo(f"rollouts: {result['written']} trajectories written to {result['sink']} "
                   f"({result['resumed']} resumed, {result['failed']} failed, {result['dropped']} dropped)")
