"""The memory benchmark (``planweave bench memory``): what memory across runs saves on related goals, and how well
retrieval finds the relevant entries.

1. **Memory on vs off.** A seeded family of related goals ("weather report for <city>", cities drawn with a seed)
   is planned by the scripted OpenAI-compatible server (:class:`~planweave.testing.ScriptedLLM`, real HTTP on
   127.0.0.1, through the real ``OpenAIChatClient`` and planning loop) and run on the engine (virtual clock). The
   scripted planner is told by the prompt it receives whether a retrieved skill applies: if the prompt carries the
   skill ``city-report``, it writes the short plan that reuses it (2 steps); otherwise the long exploratory plan
   (9 steps: search sources, probe four, pick one, fetch, parse, report). With memory on, a run that recalled no
   skill is distilled (one model call writing a skill and a lesson with a check), and the candidates are verified
   (the skill replayed through the engine, the lesson's check run) before anything is admitted. Steps and tokens
   per goal are counted with that overhead included (distillation tokens, replay and check steps).
2. **Retrieval precision@k** on a labelled set: a memory of admitted entries from several task families (a skill
   and two lessons each, in their own words), queried with goals phrased differently from the entries; the relevant
   entries of a query are its family's. precision@k = relevant in the top k / k, averaged over the queries; with
   the ``[memory-embed]`` extra and the model package, also for hybrid retrieval (BM25 + embedding cosine,
   ``retrieval.hybrid``) with the encode time per entry.

``planweave bench memory [--goals N] [--seed S] [--json]`` or ``python -m planweave.bench.memory``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from planweave.bench.cli import parse_command_line

__all__ = ["main", "precision_at_k", "run_bench", "scripted_planner"]

SKILL = "city-report"
CITIES = ("oslo", "lima", "cairo", "hanoi", "quito", "perth", "dakar", "riga", "sofia", "accra", "bern", "doha",
          "minsk", "tunis", "kyiv", "baku")
_GOAL = re.compile(r"Goal: weather report for (\w+)")


def _steps(names: Sequence[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    return [{"id": sid, "tool": "work", "args": {"what": what, "ms": 300}, **({"after": after} if after else {})}
            for sid, what, after in names]


def long_plan(city: str) -> list[dict[str, Any]]:
    """What the planner writes without a skill: explore sources, then fetch, parse and report."""
    probes = [(f"probe{i}", f"probe weather source {i} for {city}", ["search"]) for i in range(4)]
    return _steps([("search", f"search weather sources for {city}", []), *probes,
                   ("pick", "pick the best source", [p[0] for p in probes]),
                   ("fetch", f"fetch the forecast of {city}", ["pick"]),
                   ("parse", "parse the forecast", ["fetch"]),
                   ("report", f"write the weather report of {city}", ["parse"])])


def skill_steps(city: str) -> list[dict[str, Any]]:
    """The skill's sub-plan for ``city`` (what the distiller records with ``${city}``, and the short plan)."""
    return _steps([("fetch", f"fetch the forecast of {city} from the best source", []),
                   ("report", f"write the weather report of {city}", ["fetch"])])


def _distilled(city: str) -> str:
    steps = json.loads(json.dumps(skill_steps("${city}")))
    lines = [
        {"kind": "skill", "name": SKILL, "text": "weather report for a city: fetch its forecast from the best "
         "source and write the report", "steps": steps, "params": {"city": city}, "steps_used": ["fetch", "report"]},
        {"kind": "lesson", "name": "weather-sources", "text": "for a weather report the first source probed was the "
         "best: probing the others is wasted", "check": {"tool": "work", "args": {"what": "probe weather source 0",
                                                                                  "ms": 100}},
         "steps_used": ["probe0", "pick"]},
    ]
    return "\n".join(json.dumps(line) for line in lines)


def scripted_planner(req: Any) -> Any:
    """The scripted model of the benchmark: planner (long plan, or the short one when the prompt carries the skill),
    joiner and distiller."""
    from planweave.testing.scripted_llm import Text, plan_lines

    text = " ".join(str(m.get("content", "")) for m in req.messages)
    if "You distil what an agent run learned" in text:
        match = _GOAL.search(text)
        return Text(_distilled(match.group(1) if match else "oslo"))
    if "If the results answer the goal" in text:
        return Text('{"answer": "the weather report is written"}')
    match = _GOAL.search(text)
    city = match.group(1) if match else "oslo"
    applies = f"skill '{SKILL}'" in text  # the planner is told by its prompt whether the skill applies
    return Text(plan_lines(skill_steps(city) if applies else long_plan(city)))


@dataclass
class GoalRow:
    goal: str
    memory: bool
    steps: int
    tokens: int
    model_calls: int
    recalled: list[int]
    overhead_steps: int = 0
    overhead_tokens: int = 0


async def _family(goals: list[str], memory: bool) -> list[GoalRow]:
    from planweave import Toolbox, builtin_tools, open_engine
    from planweave.core.clock import VirtualClock
    from planweave.limits import RunLimits
    from planweave.memory import InMemoryStore, MemoryRecall
    from planweave.memory.distill import distill
    from planweave.memory.verify import verify_all
    from planweave.models.openai import OpenAIChatClient
    from planweave.planning.factory import build_planning_loop
    from planweave.testing.scripted_llm import ScriptedLLM

    tools: Toolbox = builtin_tools()

    async def work(what: str, ms: int = 100) -> dict[str, Any]:
        """Do a piece of the task (``what``), taking ``ms`` milliseconds."""
        await asyncio.sleep(ms / 1000)
        return {"done": what}

    tools.add(work, idempotent=True)
    store = InMemoryStore()
    server = ScriptedLLM(scripted_planner)
    rows: list[GoalRow] = []

    async with server as base_url, OpenAIChatClient("scripted", base_url=base_url, api_key="k") as client, \
            open_engine("memory://", tools=tools, clock=VirtualClock()) as engine:
        for goal in goals:
            recall = MemoryRecall(store) if memory else None
            before = len(server.served)
            loop = build_planning_loop(engine, client, tools, RunLimits(), memory=recall)
            result = await loop.run(goal)
            if not result.ok:
                raise RuntimeError(f"bench memory: the run of '{goal}' {result.status}: {result.error}")
            calls = server.served[before:]
            row = GoalRow(goal, memory, len(result.state.records), sum(c.tokens for c in calls), len(calls),
                          list(recall.last) if recall else [])
            if recall is not None and not recall.last:  # nothing applied: learn from this run
                mark = len(server.served)
                distilled = await distill(client, store, goal, result)
                verified = await verify_all(engine, store, list(distilled.entries))
                row.overhead_tokens = sum(c.tokens for c in server.served[mark:])
                row.overhead_steps = sum(1 if e.kind == "lesson" else len(e.steps) for e in verified)
            rows.append(row)
    return rows


def _summary(rows: list[GoalRow]) -> dict[str, Any]:
    n = len(rows)
    steps = sum(r.steps + r.overhead_steps for r in rows)
    tokens = sum(r.tokens + r.overhead_tokens for r in rows)
    return {"steps_per_goal": round(steps / n, 2), "tokens_per_goal": round(tokens / n, 1),
            "model_calls_per_goal": round(sum(r.model_calls for r in rows) / n, 2),
            "overhead": {"steps": sum(r.overhead_steps for r in rows),
                         "tokens": sum(r.overhead_tokens for r in rows)},
            "goals_that_recalled_memory": sum(1 for r in rows if r.recalled)}


# -- retrieval ------------------------------------------------------------------------------------------------------
FAMILIES: dict[str, tuple[tuple[str, str], tuple[str, str], tuple[str, str], tuple[str, ...]]] = {
    # family: (skill name, text), two lessons (name, text), queries phrased differently
    "weather": (("city-report", "weather report for a city: fetch its forecast and write the report"),
                ("weather-sources", "the first weather source probed is usually the best"),
                ("forecast-units", "forecast temperatures come in celsius, convert for US readers"),
                ("weather report for lima", "write today's forecast summary for cairo", "is it raining in oslo")),
    "invoice": (("invoice-pdf", "render an invoice as a PDF from the billing records and email it"),
                ("invoice-vat", "VAT must be shown per line on an EU invoice"),
                ("billing-export", "the billing export is paginated: fetch every page of records"),
                ("send the march invoice to acme", "bill the customer for last month", "email a PDF invoice")),
    "deploy": (("canary-deploy", "deploy a service: canary first, watch error rates, then full rollout"),
               ("deploy-rollback", "roll back a deploy when the canary error rate rises"),
               ("deploy-migrations", "run database migrations before the new service version starts"),
               ("roll out version 2 of the api service", "ship the new release to production",
                "deploy the payments service")),
    "papers": (("paper-survey", "survey research papers: search arXiv, read abstracts, summarise findings"),
               ("arxiv-rate", "the arXiv API limits requests: wait between searches"),
               ("citation-format", "cite papers with authors, year and arXiv id"),
               ("summarise recent papers on protein folding", "literature review of diffusion models",
                "find research on graph neural networks")),
    "tests": (("fix-failing-test", "fix a failing test: reproduce it, read the traceback, patch, rerun the suite"),
              ("flaky-tests", "a test that fails only under load waits on wall-clock time"),
              ("pytest-select", "run the one failing test with pytest -k before the whole suite"),
              ("the CI build is red on test_login", "repair the broken unit test", "pytest fails in the parser")),
    "data": (("csv-clean", "clean a CSV dataset: drop duplicate rows, fix dates, fill missing values"),
             ("csv-encoding", "read CSV files as UTF-8 with a BOM check"),
             ("dataset-schema", "check a dataset's columns against its schema before loading it"),
             ("tidy the sales spreadsheet export", "deduplicate the customer records file",
              "prepare the survey data for analysis")),
}


def precision_at_k(ranked: Sequence[int], relevant: set[int], k: int) -> float:
    """Relevant entries among the first ``k`` ranked, over ``k``."""
    return sum(1 for entry_id in ranked[:k] if entry_id in relevant) / k


async def _labelled_memory() -> tuple[list[Any], dict[str, set[int]]]:
    from planweave.memory import Candidate, InMemoryStore

    store = InMemoryStore()
    relevant: dict[str, set[int]] = {}
    for family, (skill, lesson_a, lesson_b, _queries) in FAMILIES.items():
        ids = set()
        stored = await store.add(Candidate("skill", skill[0], skill[1], ({"id": "a", "tool": "noop", "args": {}},)))
        ids.add(stored.id)
        for name, text in (lesson_a, lesson_b):
            ids.add((await store.add(Candidate("lesson", name, text))).id)
        relevant[family] = ids
    for entry in await store.entries():
        await store.set_status(entry.id, "admitted")
    return await store.entries(status="admitted"), relevant


def _precision(ranker: Any, admitted: list[Any], relevant: dict[str, set[int]], ks: Sequence[int]) -> dict[str, Any]:
    scores: dict[int, list[float]] = {k: [] for k in ks}
    misses = []
    for family, (*_entries, queries) in FAMILIES.items():
        for query in queries:
            ranked = [e.id for e, _ in ranker(query, admitted, max(ks))]
            for k in ks:
                scores[k].append(precision_at_k(ranked, relevant[family], k))
            if not ranked or ranked[0] not in relevant[family]:
                misses.append(query)
    return {**{f"precision_at_{k}": round(statistics.fmean(scores[k]), 3) for k in ks}, "top1_misses": misses}


def _hybrid(admitted: list[Any], relevant: dict[str, set[int]], ks: Sequence[int]) -> dict[str, Any] | None:
    """Hybrid retrieval (BM25 + all-MiniLM-L6-v2 cosine) on the same set, and the encode time per entry; None
    without the [memory-embed] extra and the model package."""
    import time

    from planweave.memory.embed import MiniLMEncoder, available
    from planweave.memory.hybrid import rank_hybrid

    if not available():
        return None
    started = time.perf_counter()
    encoder = MiniLMEncoder()
    load_s = time.perf_counter() - started
    texts = [e.search_text() for e in admitted]
    encoder.encode(texts)  # warm-up: the first call pays for BLAS threads and the weights' first touch

    def per_entry_ms(batches: list[list[str]]) -> float:  # the median of 3 rounds
        rounds = []
        for _ in range(3):
            started = time.perf_counter()
            for batch in batches:
                encoder.encode(batch)
            rounds.append((time.perf_counter() - started) * 1000 / len(texts))
        return statistics.median(rounds)

    batched_ms = per_entry_ms([texts])  # batched, as a recall encodes a memory
    single_ms = per_entry_ms([[text] for text in texts])
    return {**_precision(lambda q, entries, k: rank_hybrid(q, entries, k, encoder), admitted, relevant, ks),
            "model_load_s": round(load_s, 3), "encode_ms_per_entry_batched": round(batched_ms, 2),
            "encode_ms_per_entry_one_by_one": round(single_ms, 2)}


async def _retrieval(ks: Sequence[int]) -> dict[str, Any]:
    from planweave.memory import rank

    admitted, relevant = await _labelled_memory()
    bm25 = _precision(rank, admitted, relevant, ks)
    hybrid = _hybrid(admitted, relevant, ks)
    if hybrid is not None:
        hybrid["found_where_bm25_missed"] = [q for q in bm25["top1_misses"] if q not in hybrid["top1_misses"]]
    return {"entries": len(admitted), "queries": sum(len(f[3]) for f in FAMILIES.values()), **bm25,
            "hybrid": hybrid}


def run_bench(goals: int, seed: int) -> dict[str, Any]:
    """Both parts; returns the JSON object ``--json`` prints."""
    from planweave.core.clock import run_virtual

    rng = random.Random(seed)
    family = [f"weather report for {city}" for city in rng.sample(CITIES, k=min(goals, len(CITIES)))]
    off = run_virtual(_family(family, memory=False))
    on = run_virtual(_family(family, memory=True))
    retrieval = asyncio.run(_retrieval((1, 3)))
    return {"goals": len(family), "seed": seed, "off": _summary(off), "on": _summary(on),
            "per_goal": [{"goal": a.goal, "steps_off": a.steps, "steps_on": b.steps + b.overhead_steps,
                          "tokens_off": a.tokens, "tokens_on": b.tokens + b.overhead_tokens,
                          "recalled": b.recalled} for a, b in zip(off, on, strict=True)],
            "retrieval": retrieval}


def render(result: dict[str, Any]) -> str:
    off, on, r = result["off"], result["on"], result["retrieval"]
    lines = [f"memory across runs: {result['goals']} related goals (seed {result['seed']}), scripted planner",
             f"{'':10}{'steps/goal':>12}{'tokens/goal':>13}{'calls/goal':>12}",
             f"{'off':10}{off['steps_per_goal']:>12}{off['tokens_per_goal']:>13}{off['model_calls_per_goal']:>12}",
             f"{'on':10}{on['steps_per_goal']:>12}{on['tokens_per_goal']:>13}{on['model_calls_per_goal']:>12}",
             f"  (on includes distillation and verification: {on['overhead']['steps']} steps, "
             f"{on['overhead']['tokens']} tokens; {on['goals_that_recalled_memory']} goals recalled the skill)",
             f"retrieval: {r['queries']} queries over {r['entries']} entries: precision@1 {r['precision_at_1']}, "
             f"precision@3 {r['precision_at_3']} (BM25)"]
    hybrid = r.get("hybrid")
    if hybrid is None:
        lines.append("  hybrid (BM25 + embeddings): not measured, needs the [memory-embed] extra and the model package")
    else:
        lines.append(f"  hybrid (BM25 + all-MiniLM-L6-v2 cosine): precision@1 {hybrid['precision_at_1']}, precision@3 "
                     f"{hybrid['precision_at_3']}; encode {hybrid['encode_ms_per_entry_batched']} ms/entry batched, "
                     f"{hybrid['encode_ms_per_entry_one_by_one']} one by one (model load {hybrid['model_load_s']} s)")
    return "\n".join(lines)


def _command(
    goals: Annotated[int, typer.Option("--goals", min=2, max=len(CITIES), help="Related goals in the family.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the family's cities.")] = 7,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> tuple[dict[str, Any], bool]:
    """Steps and tokens per goal with memory on vs off on a seeded family of related goals, and retrieval
    precision@k on a labelled set."""
    return run_bench(goals, seed), json_output


def main(argv: Sequence[str] | None = None) -> int:
    result, as_json = parse_command_line(_command, argv, "planweave bench memory")
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
