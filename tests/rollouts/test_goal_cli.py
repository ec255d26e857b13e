"""``planweave rollouts run CONFIG.yaml`` with ``episodes_from``: goal-run episodes through the gateway in front of
the config's policy server (the toy server, in the test's loop), their samples in the sink; a config with both
``env`` and ``episodes_from`` is one message naming the file, exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import yaml

from planweave.rollouts.sinks import read_jsonl
from planweave.rollouts.toy_policy import ToyPolicyServer, goal_replies

ROOT = Path(__file__).resolve().parents[2]


def _cli(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planweave.cli.main", "rollouts", "run", str(config), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


async def test_rollouts_run_with_episodes_from_writes_goal_episodes_samples_to_the_sink(tmp_path: Path) -> None:
    toy = ToyPolicyServer(goal_replies(3))
    async with toy.serve() as url:
        config = tmp_path / "goals.yaml"
        config.write_text(yaml.safe_dump({
            "policy": {"base_url": url, "model": "toy-7b"}, "gateway": {"dialect": "vllm"},
            "episodes_from": "planweave.rollouts.toy_policy:colour_episode",
            "reward": "planweave.rollouts.toy_policy:blue_reward", "episodes": 4, "batch": 2, "concurrency": 2,
            "journal": f"sqlite:///{tmp_path / 'rollouts.db'}", "sink": str(tmp_path / "samples.jsonl")}))
        done = await asyncio.to_thread(_cli, config)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["written"] == 4 and result["samples"] == 20
    trajectories = read_jsonl(tmp_path / "samples.jsonl")
    assert sorted(t.episode for t in trajectories) == [0, 1, 2, 3]
    for trajectory in trajectories:
        assert [s.role for s in trajectory.samples].count("step") == 3
        assert all(s.completion_token_ids for s in trajectory.samples)
        assert [s.reward for s in trajectory.samples] == [float(s.role == "step" and s.text == "blue")
                                                          for s in trajectory.samples]
    assert {body["model"] for body in toy.bodies} == {"toy-7b"}  # the config's model name goes upstream


def test_a_config_with_env_and_episodes_from_is_refused_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "both.yaml"
    config.write_text(yaml.safe_dump({
        "policy": {"base_url": "http://127.0.0.1:9/v1"}, "env": "planweave.rollouts.toy:Corridor",
        "episodes_from": "planweave.rollouts.toy_policy:colour_episode", "episodes": 1, "sink": "x.jsonl"}))
    done = _cli(config)
    assert done.returncode == 2
    assert f"{config}: give env (reset/step environments) or episodes_from" in done.stdout + done.stderr
