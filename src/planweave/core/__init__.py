"""The pure core: the plan model and the decisions over it, with no I/O.

``core.plan`` (steps, references, validation, fingerprints, critical paths), ``core.events`` (the journaled events),
``core.state`` (the fold of events into a run's state), ``core.scheduler``, ``core.splice``, ``core.speculation``,
``core.replies`` and ``core.context`` (the decisions the runtime acts on), ``core.clock`` (the injected clock and its
virtual implementation) and ``core.errors``. Nothing here imports outside ``planweave.core``; everything else in
planweave may import it (tests/test_architecture.py holds the folder rules).
"""
