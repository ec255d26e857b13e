"""A goal-run rollout process run by test_goal_crash_resume.py: the toy policy server, the gateway, a journaled
:class:`GoalRollouts` and a JSON Lines sink; per batch ``delivered IDS`` before the write and ack, ``acked IDS``
after; ``hang`` after N acked batches, with episodes in flight half way, so the test can SIGKILL it."""

from __future__ import annotations

import asyncio
import sys

from planweave.api import open_engine
from planweave.rollouts.gateway import Gateway
from planweave.rollouts.goals import EpisodeSpec, GoalRollouts
from planweave.rollouts.sinks import JsonlSink
from planweave.rollouts.toy_policy import ToyPolicyServer, goal_replies


def episode(seed: int) -> EpisodeSpec:
    return EpisodeSpec(goal=f"Name three colours (episode {seed}).", budget_tokens=50_000, deadline=60)


async def main(journal: str, sink_path: str, hang_after: int) -> None:
    toy = ToyPolicyServer(goal_replies(3), delay=0.04)
    sink = JsonlSink(sink_path)
    async with toy.serve() as upstream, Gateway(upstream) as gateway, open_engine("memory://") as engine, \
            GoalRollouts(gateway, engine, episodes_from=episode, episodes=8, concurrency=2, max_staleness=10,
                         journal=journal) as rollouts:
        n = 0
        async for batch in rollouts.batches(size=2):
            ids = " ".join(str(t.episode) for t in batch)
            print(f"delivered {ids}", flush=True)
            await sink.write(batch)
            rollouts.ack(batch)
            print(f"acked {ids}", flush=True)
            restarted = " ".join(str(t.episode) for t in batch if t.resumed)
            if restarted:
                print(f"restarted {restarted}", flush=True)
            n += 1
            if n == hang_after:
                await asyncio.sleep(0.1)  # the next episodes' planner calls (40 ms) are answered: half way
                print("hang", flush=True)
                await asyncio.Event().wait()  # keep the episodes running until the test kills us
    await sink.close()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
