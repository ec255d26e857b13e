"""Executors (adapters): where step calls run outside the engine's process (``planweave.executors.ray``: Ray tasks).

The engine's own executors (in-process, a worker thread) and the :class:`~planweave.engine.executor.Executor`
protocol they keep live in :mod:`planweave.engine.executor`; this package holds those that need an optional library.
Nothing here is imported at start-up.
"""
