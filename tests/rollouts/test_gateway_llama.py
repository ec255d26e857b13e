"""The gateway in front of the real llama.cpp server (llama-cpp-python, the ``[local]`` extra: Gemma 3 270M): a goal
run (planned by a scripted planner: the 270M base model writes no usable plan) with three parallel ``llm`` steps on
the policy, as an episode, gives one sample per policy call whose completion ids are the server's
own tokens of the reply (checked against the tokens it sampled, and detokenised back to the text by the server),
with the sampled logprob per token; prompt ids are the server's tokenisation of the prompt rendered in its chat
format (gemma), kept because it has as many tokens as the server read. Skipped without
llama-cpp-python, except in CI (CI=true), where that is a failure."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from planweave.api import open_engine
from planweave.models import resolve_model
from planweave.rollouts.gateway import Gateway
from planweave.rollouts.goals import EpisodeSpec, GoalRollouts
from tests.models.test_local_model import _require_local_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PLAN = {"name": "colours", "steps": [
    {"id": f"s{i}", "tool": "llm", "args": {"prompt": f"Name colour number {i + 1} of the rainbow.",
                                           "max_tokens": 12, "temperature": 0.8}}
    for i in range(3)]}


async def test_a_goal_episode_on_llama_cpp_gives_one_sample_per_call_with_the_servers_token_ids(
        tmp_path: Path) -> None:
    _require_local_model()
    from planweave.models.local import local_server

    script = tmp_path / "planner.yaml"
    script.write_text(yaml.safe_dump({"plan": PLAN["steps"], "answer": "three colours"}), encoding="utf-8")
    async with local_server() as upstream, resolve_model(f"scripted:{script}") as planner, \
            Gateway(upstream, dialect="llama-cpp-python", chat_format="gemma") as gateway, \
            open_engine("memory://") as engine, GoalRollouts(
                gateway, engine, episodes_from=lambda seed: EpisodeSpec(
                    goal="Name three colours of the rainbow.", planner=planner, model="local", deadline=300),
                episodes=1, concurrency=1) as rollouts:
        [episode] = [t async for batch in rollouts.batches(size=1) for t in batch]
        root = upstream.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=60) as http:
            decoded = [None if s.completion_token_ids is None else (await http.post(
                f"{root}/extras/detokenize", json={"tokens": list(s.completion_token_ids)})).json()["text"]
                for s in episode.samples]
            prompts = [(await http.post(f"{root}/extras/detokenize",
                                        json={"tokens": list(s.prompt_token_ids or ())})).json()["text"]
                       for s in episode.samples]
    assert episode.meta["status"] == "succeeded", episode.meta
    samples = episode.samples
    assert len(samples) == 3 and sorted(str(s.step) for s in samples) == ["s0", "s1", "s2"]
    assert all(s.role == "step" and s.run == episode.meta["run"] for s in samples)
    with_ids = [(s, text) for s, text in zip(samples, decoded, strict=True) if s.completion_token_ids is not None]
    assert with_ids, [s.token_ids_missing for s in samples]
    for sample, text in with_ids:
        assert text == sample.text  # the ids decode back to the text the endpoint returned
        assert sample.ids_from == "tokenize-checked" and sample.dialect == "llama-cpp-python"
        assert sample.logprobs is not None and len(sample.logprobs) == len(sample.completion_token_ids or ())
        assert all(lp <= 0.0 for lp in sample.logprobs)
    for sample, prompt in zip(samples, prompts, strict=True):
        assert sample.prompt_token_ids is not None and sample.prompt_ids_from == "rendered-checked"
        asked = str(sample.messages[-1]["content"])
        assert prompt.endswith(f"user\n{asked}\nmodel\n")  # its detokeniser leaves out the turn markers
        if sample.completion_token_ids is None:  # the reply's tokenisation differed from the sampled tokens
            assert sample.token_ids_missing is not None and "were sampled" in sample.token_ids_missing
