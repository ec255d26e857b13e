"""planweave bench context: re-plan prompts by reference stay flat as a run grows; the quick mode's JSON."""

from __future__ import annotations

import json

import pytest

from planweave import run_virtual
from planweave.bench.context import main, run_goal
from planweave.planning.context import ContextLimits

K = 1.2  # prompt tokens at 1,000 finished steps may be at most K x those at 100


def test_replan_prompt_tokens_at_1000_steps_stay_within_k_of_100_steps() -> None:
    run = run_virtual(run_goal("references", 1000))
    assert run.ok, run.error
    assert run.finished_steps == 1000 and run.blind == 0
    assert run.replan_tokens[1000] <= K * run.replan_tokens[100], run.replan_tokens


def test_the_bound_fails_when_references_are_not_bounded() -> None:
    """The deliberate breakage: every finished step listed by reference (no ``refs`` bound) grows past K."""
    run = run_virtual(run_goal("references", 1000, limits=ContextLimits(refs=10**6)))
    assert run.ok, run.error
    assert run.replan_tokens[1000] > K * run.replan_tokens[100], run.replan_tokens


def test_quick_mode_prints_both_contexts_at_each_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["prompt_tokens"]) == set(data["baseline"]) == {"20", "100"}
    assert all(isinstance(n, int) and n > 0 for n in [*data["prompt_tokens"].values(), *data["baseline"].values()])
    assert data["runs"]["references"]["finished_steps"] == data["runs"]["baseline"]["finished_steps"] == 100
    assert "estimate" in data["tokens"]
    assert main(["--quick"]) == 0
    assert "summary baseline" in capsys.readouterr().out


def test_a_checkpoint_that_is_not_a_multiple_of_the_batch_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "15"])
    assert exc.value.code == 2
    assert "--steps" in capsys.readouterr().err
