"""Which executor the engine gets: ``--executor local|thread|ray`` and ``--ray-address`` of ``worker``, the
``executor`` and ``ray_address`` keys of a run configuration (``run``, ``goal``, ``resume``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Literal

import typer

from planweave.cli.common import PANEL_SCHEDULING
from planweave.core.plan import PlanSpec
from planweave.engine.executor import Executor, InProcessExecutor, ThreadExecutor
from planweave.extras import installed, require

ExecutorKind = Literal["local", "thread", "ray"]

ExecutorOption = Annotated[ExecutorKind | None, typer.Option(
    "--executor", rich_help_panel=PANEL_SCHEDULING,
    help="Where tool calls run: local (the engine's loop), thread (a worker thread) or ray (Ray tasks; "
                       "a step's own executor: key wins). Default local; steps that say executor: ray go to Ray "
                       "whatever this is.")]
RayAddressOption = Annotated[str | None, typer.Option(
    "--ray-address", rich_help_panel=PANEL_SCHEDULING, metavar="ADDR", envvar="RAY_ADDRESS",
    help="The Ray cluster (host:port as `ray start --head` prints it; default $RAY_ADDRESS, else a local Ray is "
         "started).")]


@dataclass(frozen=True)
class ExecutorFlags:
    """The executor flags of a ``run`` or ``resume``, the ``--tools`` references Ray workers may import, and whether
    the plan has steps that say ``executor: ray`` (None: not known before it runs, a resume or a goal)."""

    kind: ExecutorKind | None = None
    ray_address: str | None = None
    tool_flags: tuple[str, ...] = ()
    ray_steps: bool | None = None

    def for_plan(self, spec: PlanSpec) -> ExecutorFlags:
        """These flags, knowing the plan's steps."""
        return replace(self, ray_steps=any(step.executor == "ray" for step in spec.steps))

    def executor(self) -> Executor:
        """The engine's executor: a Ray executor (connected on its first Ray step) for ``--executor ray``,
        ``--ray-address`` or a plan with Ray steps, and when the plan is not known but Ray is installed (its steps
        may say ray); else the local one. Raises MissingExtra when Ray is asked for and not installed."""
        local: Executor = ThreadExecutor() if self.kind == "thread" else InProcessExecutor()
        asked = self.kind == "ray" or bool(self.ray_address) or bool(self.ray_steps)
        if asked or (self.ray_steps is None and installed("ray")):
            require("ray", "--executor ray (steps on Ray)")
            from planweave.executors.ray import RayExecutor

            return RayExecutor(self.ray_address, default="ray" if self.kind == "ray" else "local", local=local,
                               toolboxes=self.tool_flags)
        return local


NO_EXECUTOR_FLAGS = ExecutorFlags()
