"""The AsyncHow check: safe loading, plan conversion, and every real instance landing in its gold interval."""

from __future__ import annotations

import os
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from planweave.bench.asynchow import (
    FILES,
    DataSetError,
    UnsafePickle,
    load_instances,
    load_pickle,
    run_asynchow,
)

REAL_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "asynchow"

DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)


def _columns(instances: list[dict[str, Any]]) -> dict[str, Any]:
    """Lay instances out the way the data set does: a dict of parallel lists."""
    keys = ("titles", "step_nums", "timedelta_dic", "step_deps", "task_time")
    columns: dict[str, Any] = {key: [inst[key] for inst in instances] for key in keys}
    columns["nshot_instructions"] = {"examples": "", "indexes": []}
    return columns


def _instance(title: str, durations: list[tuple[timedelta, timedelta]], deps: Any,
              gold: tuple[timedelta, timedelta]) -> dict[str, Any]:
    return {
        "titles": title,
        "step_nums": len(durations),
        "timedelta_dic": {str(k + 1): list(pair) for k, pair in enumerate(durations)},
        "step_deps": deps,
        "task_time": list(gold),
    }


def _write(directory: Path, files: dict[str, list[dict[str, Any]]]) -> Path:
    for name in FILES:
        (directory / name).write_bytes(pickle.dumps(_columns(files.get(name, [])), protocol=4))
    return directory


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    """Three small files: a diamond with a month-long step, a chain, a parallel plan, and one wrong gold answer."""
    month = (28 * DAY, 31 * DAY)
    return _write(tmp_path, {
        "async_benchmark.pkl": [
            # 1 -> {2, 3} -> 4; the month (upper bound 31 days) is on the critical path: 1 + 31 + 2 days.
            _instance("How to grow a garden", [(DAY, DAY), month, (2 * DAY, 2 * DAY), (2 * DAY, 2 * DAY)],
                      {("1", "2"), ("1", "3"), ("2", "4"), ("3", "4")}, (31 * DAY, 34 * DAY)),
            # A year-long step, far from virtual time zero.
            _instance("How to age a wine", [(365 * DAY, 366 * DAY), (DAY, DAY)], {("1", "2")},
                      (366 * DAY, 367 * DAY)),
        ],
        "seq_benchmark.pkl": [
            _instance("How to boil an egg", [(MINUTE, MINUTE), (10 * MINUTE, 10 * MINUTE)], [("1", "2")],
                      (11 * MINUTE, 11 * MINUTE)),
        ],
        "para_benchmark.pkl": [
            _instance("How to tidy up", [(MINUTE, MINUTE), (3 * MINUTE, 3 * MINUTE)], [],
                      (3 * MINUTE, 3 * MINUTE)),
            # Gold says 5 minutes, but two parallel steps of 1 and 3 minutes take 3: a mismatch to report.
            _instance("How to be wrong", [(MINUTE, MINUTE), (3 * MINUTE, 3 * MINUTE)], [],
                      (5 * MINUTE, 5 * MINUTE)),
        ],
    })


def test_run_asynchow_counts_makespans_inside_the_gold_interval(synthetic: Path) -> None:
    report = run_asynchow(synthetic)

    assert report["total"] == 5
    assert report["exact"] == 4
    assert report["seconds"] >= 0
    assert report["files"]["async_benchmark.pkl"] == {"total": 2, "exact": 2}


def test_a_mismatch_names_file_index_title_makespan_and_gold(synthetic: Path) -> None:
    report = run_asynchow(synthetic)

    assert report["mismatches"] == [{
        "file": "para_benchmark.pkl",
        "index": 1,
        "title": "How to be wrong",
        "makespan": 180.0,
        "gold": [300.0, 300.0],
    }]


def test_steps_sleep_their_upper_duration_bound(synthetic: Path) -> None:
    diamond = load_instances(synthetic)[0]

    assert diamond.durations["s2"] == (31 * DAY).total_seconds()
    assert diamond.workload().critical_path == (34 * DAY).total_seconds()
    assert diamond.workload().deps["s4"] == ("s2", "s3")


def test_restricted_unpickler_rejects_other_classes(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return os.system, (f"touch {marker}",)

    evil = tmp_path / "async_benchmark.pkl"
    evil.write_bytes(pickle.dumps({"titles": [Exploit()]}))

    with pytest.raises(UnsafePickle, match=r"references (posix|os|nt)\.system; only datetime\.timedelta"):
        load_pickle(evil)
    assert not marker.exists()


def test_run_asynchow_refuses_an_unsafe_file_before_running_anything(synthetic: Path) -> None:
    (synthetic / "seq_benchmark.pkl").write_bytes(pickle.dumps({"titles": [print]}))

    with pytest.raises(UnsafePickle, match=r"seq_benchmark\.pkl"):
        run_asynchow(synthetic)


def test_a_missing_file_is_a_data_set_error(tmp_path: Path) -> None:
    with pytest.raises(DataSetError, match=r"async_benchmark\.pkl not found"):
        run_asynchow(tmp_path)


def test_a_truncated_pickle_is_a_data_set_error(synthetic: Path) -> None:
    path = synthetic / "async_benchmark.pkl"
    path.write_bytes(path.read_bytes()[:40])

    with pytest.raises(DataSetError, match="not a readable pickle"):
        load_pickle(path)


def test_a_dependency_on_an_unknown_step_is_reported(tmp_path: Path) -> None:
    _write(tmp_path, {"async_benchmark.pkl": [
        _instance("How to dangle", [(MINUTE, MINUTE)], [("1", "7")], (MINUTE, MINUTE)),
    ]})

    with pytest.raises(DataSetError, match=r"async_benchmark.pkl #0 \('How to dangle'\): dependency .* step 7"):
        load_instances(tmp_path)


@pytest.mark.skipif(not REAL_DATA.is_dir(), reason=f"the AsyncHow data set is not at {REAL_DATA}")
def test_every_real_asynchow_instance_is_exact() -> None:
    report = run_asynchow(REAL_DATA)

    assert report["total"] == 1998
    assert report["mismatches"] == []
    assert report["exact"] == 1998
    assert report["bound_agrees"] == 1998  # the plan's own critical-path bound agrees with the engine
