"""examples/rollouts/goal_train.py trains its small policy from goal-run episodes' exported samples: the probability
it gives the rewarded first token rises over the steps (the toy server stays the sampler)."""

from __future__ import annotations

from examples.rollouts.goal_train import main


async def test_the_goal_run_example_trains_its_policy_toward_the_rewarded_reply() -> None:
    history = await main(steps=4, batch=4, kind="toy")
    assert len(history) == 4
    assert history[-1] > max(history[0], 0.25)  # from nothing (or a first step's share) to well above 1/4
