"""Allocation (MCPP): which model tier and how many parallel samples each ``llm`` step gets.

:class:`Allocator` (pure) maximises P(the run completes within budget and deadline) by Monte Carlo over the remaining
plan; :class:`AllocationSeam` is what the ``llm`` tool asks before a ``model: auto`` call (it reads the run's
remaining plan, asks the allocator and journals an ``allocation`` event). :class:`CascadeSeam` runs ``model: cascade``
steps cheapest tier first, escalating when a monitor (:mod:`planweave.allocate.monitors`) fires. See
docs/allocation.md.
"""

from __future__ import annotations

from planweave.allocate.allocator import POLICIES, Allocator, Policy
from planweave.allocate.auto import allocated_call
from planweave.allocate.cascade import Cascade, Shift
from planweave.allocate.cascade_seam import CascadeArgs, CascadeSeam, PlannerCascade
from planweave.allocate.model import (
    MAX_SAMPLES,
    SELECTS,
    AllocationError,
    Backoff,
    Candidate,
    Choice,
    Decision,
    Estimate,
    Problem,
    Select,
    StepOptions,
    TierProfile,
    TierTable,
)
from planweave.allocate.monitors import (
    Fire,
    LowConfidenceMonitor,
    MilestoneMonitor,
    MonitorSet,
    Signal,
    StuckMonitor,
)
from planweave.allocate.samples import Verifier, output_key, run_samples
from planweave.allocate.seam import AllocatedRun, AllocationSeam, AutoArgs
from planweave.allocate.tiers_file import load_tiers

__all__ = [
    "MAX_SAMPLES",
    "POLICIES",
    "SELECTS",
    "AllocatedRun",
    "AllocationError",
    "AllocationSeam",
    "Allocator",
    "AutoArgs",
    "Backoff",
    "Candidate",
    "Cascade",
    "CascadeArgs",
    "CascadeSeam",
    "Choice",
    "Decision",
    "Estimate",
    "Fire",
    "LowConfidenceMonitor",
    "MilestoneMonitor",
    "MonitorSet",
    "PlannerCascade",
    "Policy",
    "Problem",
    "Select",
    "Shift",
    "Signal",
    "StepOptions",
    "StuckMonitor",
    "TierProfile",
    "TierTable",
    "Verifier",
    "allocated_call",
    "load_tiers",
    "output_key",
    "run_samples",
]
