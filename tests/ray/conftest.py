"""One Ray cluster for the Ray tests: ``ray start --head --num-cpus 2`` in a temp dir, stopped by its own pids."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from planweave.testing.ray_cluster import LocalRayCluster

pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalRayCluster]:
    """The session's cluster, with this process connected to it (so executors do not connect or disconnect)."""
    import ray

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    cluster = LocalRayCluster(num_cpus=2, resources='{"gizmo": 1}')
    cluster.start()
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    try:
        ray.init(address=cluster.address, logging_level=logging.ERROR, configure_logging=False)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def ray_address(ray_cluster: LocalRayCluster) -> str:
    return ray_cluster.address
