"""Benchmarks: the AsyncHow makespan check, the engine benchmark against its peers, and the workloads they share.

Run them with ``planweave bench asynchow DIR`` and ``planweave bench engine`` (or ``python -m
planweave.bench.engine``); the method and the latest numbers are in ``docs/benchmarks.md``.
"""
