"""`GET /metrics`: the model calls' admission decisions, scraped for real over HTTP in the Prometheus text format."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text
from tests.server.conftest import start_live

PLAN = {"steps": [
    {"id": "a", "tool": "llm", "args": {"prompt": "one", "max_tokens": 20}},
    {"id": "b", "tool": "llm", "args": {"prompt": "two", "max_tokens": 20}},
    {"id": "c", "tool": "llm", "args": {"prompt": "three", "max_tokens": 20}, "after": ["a", "b"]},
]}


def answer(req: RecordedRequest) -> Reply:
    return Text("an answer", ttft=0.01)


def samples(text: str, base_url: str) -> dict[str, float]:
    """The samples of this server's model endpoint, by name (plus the signal label for the signals counter)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("base_url") != base_url:
                continue
            key = s.name + "".join(f"[{s.labels[k]}]" for k in ("signal", "le") if k in s.labels)
            out[key] = s.value
    return out


async def test_metrics_show_every_llm_call_admitted_and_its_wait(journal_url: str) -> None:
    async with start_live(journal_url, model=answer) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": PLAN})
        assert accepted.status_code == 201, accepted.text
        report = await live.finished(client, accepted.json()["run_id"])
        scraped = await client.get("/metrics")
        anonymous = await client.get("/metrics", headers={"Authorization": ""})
    assert report["status"] == "succeeded", report
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    base_url = next(s.labels["base_url"] for f in text_string_to_metric_families(scraped.text) for s in f.samples
                    if s.name == "planweave_model_admitted_total" and s.labels.get("model") == "scripted"
                    and s.value == 3)
    got = samples(scraped.text, base_url)
    assert got["planweave_model_admitted_total"] == 3
    assert got["planweave_model_finished_total"] == 3
    assert got["planweave_model_signals_total[ok]"] == 3
    assert got["planweave_model_queue_length"] == 0 and got["planweave_model_in_flight"] == 0
    assert got["planweave_model_wait_seconds_count"] == 3
    assert got["planweave_model_wait_seconds_bucket[+Inf]"] == 3
    assert got["planweave_model_window"] == 16  # the client's default: a fixed limit of 16 per model
    assert anonymous.status_code == 401
