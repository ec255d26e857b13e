"""A plan posted with a deadline and a ``pressure:`` section: the server's live forecast drives deadline pressure,
which drops the optional step, and the run finishes in time (without ``pressure:`` the deadline cancels it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import start_live


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def sleeping(sid: str, seconds: float, estimate: float, after: list[str], **extra: Any) -> dict[str, Any]:
    return {"id": sid, "tool": "sleep", "args": {"seconds": seconds}, "after": after,
            "estimate": {"duration": estimate}, **extra}


# 'a' is estimated at 1 s and takes 3: at first the plan needs 4 s of its 5; once 'a' ends, 'b' (1 s) fits and the
# optional 'extra' (3 s) does not. 'b' ends at 4 s, a second before the deadline (the server runs on the real clock).
LATE = {"steps": [sleeping("a", 3, 1, []), sleeping("b", 1, 1, ["a"]),
                  sleeping("extra", 3, 3, ["a"], optional=True)]}


@pytest.mark.parametrize("pressure", [True, False])
async def test_a_posted_plans_pressure_drops_its_optional_step_before_the_deadline(journal_url: str,
                                                                                  pressure: bool) -> None:
    plan = {**LATE, "pressure": {"actions": ["drop_optional"]}} if pressure else LATE
    async with start_live(journal_url) as live, live.client() as client:
        accepted = await client.post("/runs", json={"plan": plan, "deadline": 5})
        assert accepted.status_code == 201, accepted.text
        run_id = accepted.json()["run_id"]
        report = await live.finished(client, run_id)
        events = await live.journal_events(run_id)
    escalations = [e for e in events if e.kind == "escalation"]
    if pressure:
        assert report["status"] == "succeeded", report
        assert report["steps"]["extra"]["status"] == "cancelled"
        assert [e.data["action"] for e in escalations] == ["drop_optional"]
    else:
        assert report["status"] == "cancelled" and not escalations
