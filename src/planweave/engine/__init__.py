"""The engine: step state machine and event fold, scheduler decisions (pure), and the asyncio runtime."""

import importlib.machinery as _machinery

from planweave.core.context import StepContext, current_step
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.engine import runtime as _runtime
from planweave.engine.runtime import DEFAULT_CONCURRENCY, Engine, Run, RunResult, send_approval, send_input

COMPILED = _runtime.__file__ is not None and _runtime.__file__.endswith(tuple(_machinery.EXTENSION_SUFFIXES))
"""Whether this install's engine hot path is compiled (mypyc: setup.py, ``PLANWEAVE_COMPILE=1``), not pure Python."""

__all__ = ["COMPILED", "DEFAULT_CONCURRENCY", "Engine", "Event", "Run", "RunResult", "RunState", "StepContext",
           "current_step", "send_approval", "send_input"]
