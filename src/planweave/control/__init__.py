"""Acting while thinking: a real-time control loop where slow inference overlaps execution (docs/control.md).

The pure core decides: :mod:`planweave.control.realign` (chunks, realignment strategies, the action plan they are
spliced into) and :mod:`planweave.control.trigger` (when to infer). :mod:`planweave.control.loop` runs them on the
engine's clock and journals the run; :mod:`planweave.control.envs` holds simulated environments to measure on.
"""

from planweave.control.loop import (
    ChunkRequest,
    ControlError,
    ControlLoop,
    ControlReport,
    Environment,
    Policy,
    Splice,
    TickRecord,
    replay_splices,
)
from planweave.control.realign import (
    ActionPlan,
    Aligned,
    Chunk,
    CustomRealign,
    DropExpired,
    Nearest,
    Realign,
    RollForward,
    blend,
    drop_expired,
)
from planweave.control.trigger import InferenceTrigger, LatencyEstimate

__all__ = ["ActionPlan", "Aligned", "Chunk", "ChunkRequest", "ControlError", "ControlLoop", "ControlReport",
           "CustomRealign", "DropExpired", "Environment", "InferenceTrigger", "LatencyEstimate", "Nearest", "Policy",
           "Realign", "RollForward", "Splice", "TickRecord", "blend", "drop_expired", "replay_splices"]
