"""The engine: step state machine and event fold, scheduler decisions (pure), and the asyncio runtime."""

from planweave.engine.context import StepContext, current_step
from planweave.engine.events import Event
from planweave.engine.runtime import Engine, Run, RunResult
from planweave.engine.state import RunState

__all__ = ["Engine", "Event", "Run", "RunResult", "RunState", "StepContext", "current_step"]
