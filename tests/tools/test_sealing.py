"""Sealed secrets: a resume fills in only the placeholders its own journal sealed, never one a plan wrote."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from planweave import open_engine
from planweave.core.events import Event
from planweave.tools.registry import Toolbox
from planweave.tools.safety import SecretRedactor

REAL = "sk-real-value-0001"
STOLEN = "ghp-other-secret-0002"
ENV = {"OPENAI_API_KEY": REAL, "GITHUB_TOKEN": STOLEN}
INJECTED = ("***$GITHUB_TOKEN***", "***$GITHUB_TOKEN#0123456789abcdef***", "x***$GITHUB_TOKEN#ffffffffffffffff***")


def created(args: dict[str, Any]) -> Event:
    return Event("r1", "run_created", 0.0, None, {"plan": {"steps": [{"id": "a", "tool": "noop", "args": args}]}})


def test_a_placeholder_written_in_a_plan_stays_literal_on_unseal() -> None:
    sealer = SecretRedactor(ENV)
    for text in INJECTED:
        alone = sealer.seal(created({"k": text}))  # nothing secret in it: journaled as written
        mixed = sealer.seal(created({"k": f"{text} {REAL}", "j": text}))  # beside a real, sealed secret
        restored = SecretRedactor(ENV).unseal([alone, mixed])
        assert restored[0].data["plan"]["steps"][0]["args"] == {"k": text}
        assert restored[1].data["plan"]["steps"][0]["args"] == {"k": f"{text} {REAL}", "j": text}


def test_each_sealed_event_has_its_own_nonce_and_only_its_own_is_unsealed() -> None:
    sealer = SecretRedactor(ENV)
    first = sealer.seal(created({"k": REAL}))
    second = sealer.seal(created({"k": REAL}))
    assert first.data["seal"] != second.data["seal"]
    # A later event that copies the first event's placeholder (its nonce shown somewhere) does not get the value.
    copied = first.data["plan"]["steps"][0]["args"]["k"]
    later = sealer.seal(created({"k": copied.replace("OPENAI_API_KEY", "GITHUB_TOKEN"), "real": REAL}))
    restored = SecretRedactor(ENV).unseal([later])[0].data["plan"]["steps"][0]["args"]
    assert restored == {"k": copied.replace("OPENAI_API_KEY", "GITHUB_TOKEN"), "real": REAL}
    assert "seal" not in SecretRedactor(ENV).unseal([first])[0].data


def grab(seen: list[Any], gate_open: list[bool], started: asyncio.Event) -> Toolbox:
    box = Toolbox()

    async def gate() -> bool:
        started.set()
        if not gate_open[0]:
            await asyncio.Event().wait()  # the first process dies here
        return True

    async def take(value: str) -> str:
        seen.append(value)  # recorded, asserted after the run
        return "ok"

    box.add(gate, name="gate", idempotent=True)
    box.add(take, name="take")
    return box


async def test_a_resume_does_not_fill_in_a_placeholder_a_plan_or_a_replan_wrote(tmp_path: Path) -> None:
    seen: list[Any] = []
    gate_open = [False]
    started = asyncio.Event()
    tools = grab(seen, gate_open, started)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"steps": [{"id": "gate", "tool": "gate"},
                      {"id": "author", "tool": "take", "args": {"value": "***$GITHUB_TOKEN***"}, "after": ["gate"]},
                      {"id": "real", "tool": "take", "args": {"value": REAL}, "after": ["gate"]}]}
    async with open_engine(url, tools=tools, redact=SecretRedactor(ENV)) as engine:
        run = await engine.start(plan)
        await started.wait()
        # A re-plan (as a model writes one) asks for the secret by name, with a guessed nonce too.
        run.propose({"steps": [*plan["steps"],
                               {"id": "model", "tool": "take", "args": {"value": INJECTED[1]}, "after": ["gate"]}]})
    gate_open[0] = True
    async with open_engine(url, tools=tools, redact=SecretRedactor(ENV)) as engine:
        result = await (await engine.resume(run.id)).wait()
    assert result.ok, result.error
    assert sorted(seen) == sorted(["***$GITHUB_TOKEN***", INJECTED[1], REAL])
    assert STOLEN not in seen
