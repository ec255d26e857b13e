"""A rollout consumer run as its own process by test_crash_resume.py: a scripted server, a journaled rollout engine,
and per batch a line ``delivered IDS`` before it acks and ``acked IDS`` after; ``hang`` after N acked batches makes
it stop consuming (its episodes keep running) so the test can SIGKILL it mid-flight."""

from __future__ import annotations

import asyncio
import sys

from planweave.rollouts import RolloutEngine
from planweave.rollouts.toy import Countdown
from tests.rollouts.helpers import ok_policy


async def main(journal: str, hang_after: int) -> None:
    async with ok_policy(ttft=0.01) as (_, client), \
            RolloutEngine(client, lambda s: Countdown(s, turns=6), episodes=24, concurrency=4, max_staleness=10,
                          journal=journal) as rollouts:
        n = 0
        async for batch in rollouts.batches(size=4):
            ids = " ".join(str(t.episode) for t in batch)
            resumed = " ".join(str(t.episode) for t in batch if t.resumed)
            print(f"delivered {ids}", flush=True)
            rollouts.ack(batch)
            print(f"acked {ids}", flush=True)
            if resumed:
                print(f"resumed {resumed}", flush=True)
            n += 1
            if n == hang_after:
                await asyncio.sleep(0.03)  # the next episodes are half way (turns of 10 ms): the test checks it
                print("hang", flush=True)
                await asyncio.Event().wait()  # keep the episodes running until the test kills us
            await rollouts.update_policy()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
