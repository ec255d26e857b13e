"""``planweave rollouts run CONFIG.yaml``: episodes against a policy endpoint, trajectories to a sink."""

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
