"""The engine: step state machine and event fold, scheduler decisions (pure), and the asyncio runtime."""

from planweave.engine.context import StepContext, current_step
from planweave.engine.events import Event
from planweave.engine.runtime import DEFAULT_CONCURRENCY, Engine, Run, RunResult, send_approval, send_input
from planweave.engine.state import RunState

__all__ = ["DEFAULT_CONCURRENCY", "Engine", "Event", "Run", "RunResult", "RunState", "StepContext", "current_step",
           "send_approval", "send_input"]
