"""The exporters give trainers one row per model call with the exact ids and logprobs the gateway recorded: TRL's
rollout_func dict, verl's agent-loop rows in Parquet (read back with pyarrow), slime Sample fields; a call without
ids is refused naming it, or left out when asked."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from planweave.api import open_engine
from planweave.rollouts.export import ExportError, to_slime, to_trl, to_verl, write_verl_parquet
from planweave.rollouts.gateway import Gateway
from planweave.rollouts.goals import EpisodeSpec, GoalRollouts, samples_of
from planweave.rollouts.samples import Sample
from planweave.rollouts.toy_policy import ToyPolicyServer, decode, goal_replies


async def _samples() -> list[Sample]:
    toy = ToyPolicyServer(goal_replies(3), seed=1)
    async with toy.serve() as upstream, Gateway(upstream) as gateway, open_engine("memory://") as engine, \
            GoalRollouts(gateway, engine, episodes_from=lambda s: EpisodeSpec(goal=f"colours {s}"), episodes=2,
                         concurrency=2, reward=lambda o: [float(s.role == "step") for s in o.samples]) as rollouts:
        delivered = [t async for batch in rollouts.batches(size=2) for t in batch]
    return samples_of(delivered)


async def test_each_exporter_gives_one_row_per_call_with_the_recorded_ids_logprobs_and_rewards(
        tmp_path: Path) -> None:
    samples = await _samples()
    assert len(samples) == 10
    trl = to_trl(samples)
    assert set(trl) >= {"prompt_ids", "completion_ids", "logprobs", "env_reward"}
    assert all(len(v) == 10 for v in trl.values())
    for i, s in enumerate(samples):
        assert trl["prompt_ids"][i] == list(s.prompt_token_ids or ())
        assert decode(trl["completion_ids"][i]) == s.text
        assert len(trl["logprobs"][i]) == len(trl["completion_ids"][i])
        assert trl["env_reward"][i] == (1.0 if s.role == "step" else 0.0)
    rows = to_verl(samples)
    count = write_verl_parquet(samples, tmp_path / "verl.parquet")
    table = pq.read_table(tmp_path / "verl.parquet").to_pylist()
    assert count == len(table) == 10
    for row, back in zip(rows, table, strict=True):
        assert back["prompt_ids"] == row["prompt_ids"] and back["response_ids"] == row["response_ids"]
        assert back["response_logprobs"] == pytest.approx(row["response_logprobs"])
        assert back["response_mask"] == [1] * len(row["response_ids"])
        assert json.loads(back["extra_info"]) == row["extra_info"]
    slime = to_slime(samples)
    for d, s in zip(slime, samples, strict=True):
        assert d["tokens"][: len(s.prompt_token_ids or ())] == list(s.prompt_token_ids or ())
        assert d["response_length"] == len(d["loss_mask"]) == len(d["rollout_log_probs"])
        assert decode(d["tokens"][-d["response_length"]:]) == d["response"] == s.text
        assert d["group_index"] == s.episode and d["weight_versions"] == ["0"] and d["status"] == "completed"


def test_a_call_without_token_ids_is_refused_naming_it_or_left_out() -> None:
    sample = Sample(episode=4, index=2, session="s", run="r", plan_version=1, step="s1", role="step", messages=(),
                    text="x", finish_reason="stop", policy_version=0, prompt_token_ids=None,
                    completion_token_ids=None, logprobs=None, token_ids_missing="the 'openai' dialect returns none")
    with pytest.raises(ExportError, match=r"episode 4 call 2 \(step s1\): no token ids .*'openai' dialect"):
        to_trl([sample])
    assert to_slime([sample], skip_missing=True) == []
    assert to_verl([sample], skip_missing=True) == []
