"""Plan files are refused while they are read: too many values before the document is built (a 15 MB file of 10^6
argument keys cost the CLI 17.5 s and 1 GB), keys given twice naming the key and the line, a read past its time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planweave import planfile
from planweave.core.errors import PlanInvalid
from planweave.planfile import load_plan_file, plan_document


def _huge_yaml(path: Path, keys: int) -> Path:
    """One step with ``keys`` argument keys, one a line (line 5 holds the first)."""
    with path.open("w", encoding="utf-8") as handle:
        handle.write("steps:\n- id: a\n  tool: noop\n  args:\n")
        handle.writelines(f"    k{i}: {i % 10}\n" for i in range(keys))
    return path


def test_the_cli_refuses_a_file_of_a_million_keys_early_naming_the_limit_and_the_line(tmp_path: Path) -> None:
    path = _huge_yaml(tmp_path / "huge.yaml", 1_000_001)
    # The child reports its peak memory: building the document took about 1 GB, refusing it while reading ~80 MB.
    # VmHWM is the high-water mark of the child's own memory map; getrusage's ru_maxrss would also count the forking
    # parent's pages (Linux keeps the pre-exec peak), several hundred MB when this runs inside the whole suite.
    report = ("import atexit, sys\n"
              "def hwm():\n"
              "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
              "    print('maxrss_kb', line.split()[1], file=sys.stderr)\n"
              "atexit.register(hwm)\n"
              "from planweave.cli.main import main\n"
              "sys.argv = ['planweave'] + sys.argv[1:]\n"
              "main()\n")
    env = {k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}
    done = subprocess.run([sys.executable, "-c", report, "run", str(path), "--journal", "memory://"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{path} is not valid" in done.stderr
    assert "more than 1,000,000 values" in done.stderr
    assert "line 1000000, column" in done.stderr  # the value that crossed the limit (the 1,000,001st)
    peak_mb = int(done.stderr.rsplit("maxrss_kb", 1)[1].split()[0]) / 1024
    assert peak_mb < 400, f"peak memory {peak_mb:.0f} MB: the document was built before it was refused"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_too_many_values_are_refused_while_reading(tmp_path: Path, suffix: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any) -> None:
        raise AssertionError("the document was built before its values were counted")

    if suffix == ".yaml" and planfile._CLoader is not None:
        monkeypatch.setattr(planfile, "_load", never)  # only libyaml's counting pass over the events may run
    path = tmp_path / f"many{suffix}"
    values = [0] * 1_000_001
    if suffix == ".json":
        path.write_text('{"steps": [], ' + ", ".join(f'"k{i}": 1' for i in range(1_000_001)) + "}")
    else:
        path.write_text("steps: []\nname: " + json.dumps(values) + "\n")
    with pytest.raises(PlanInvalid) as raised:
        load_plan_file(path)
    assert "more than 1,000,000 values" in str(raised.value)
    if suffix == ".yaml":
        assert raised.value.problems[0].message.startswith("line 2, column ")


@pytest.mark.parametrize(("name", "text", "key", "line", "first"), [
    ("steps_twice.yaml", "steps:\n  - {id: a, tool: noop}\nsteps:\n  - {id: b, tool: noop}\n", "steps", 3, 1),
    ("id_twice.yaml", "steps:\n  - {id: a, tool: noop, id: b}\n", "id", 2, 2),
    ("nested.yaml", "steps:\n  - id: a\n    tool: noop\n    args:\n      x: 1\n      y: 2\n      x: 3\n", "x", 7, 5),
    ("quoted.yaml", "steps: []\nname: a\n'name': b\n", "name", 3, 2),
    ("date.yaml", "steps:\n  - id: a\n    tool: noop\n    args: {2001-01-01: a,\n      '2001-01-01': b}\n",
     "2001-01-01", 5, 4),
    ("steps_twice.json", '{"steps": [],\n "name": "x",\n "steps": [{"id": "b", "tool": "noop"}]}', "steps", 3, 1),
    ("id_twice.json", '{"steps": [{"id": "a", "tool": "noop",\n "args": {"s": "}{\\"id\\":"}, "id": "b"}]}', "id",
     2, 1),
    ("escaped.json", '{"steps": [],\n "name": "a", "n\\u0061me": "b"}', "name", 2, 2),
])
def test_a_key_given_twice_is_refused_naming_the_key_and_the_line(tmp_path: Path, name: str, text: str, key: str,
                                                                  line: int, first: int) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlanInvalid) as raised:
        load_plan_file(path)
    (problem,) = raised.value.problems
    assert problem.message.startswith(f"line {line}, column ")
    assert f"the key '{key}' is given twice in this object (first on line {first})" in problem.message
    assert str(path) in str(raised.value)


def test_a_merge_key_may_still_be_overridden() -> None:
    document = plan_document("steps:\n  - {id: a, tool: noop, args: {<<: {x: 1, y: 2}, x: 3}}\n", "merge.yaml")
    assert document["steps"][0]["args"] == {"x": 3, "y": 2}


def test_reading_stops_at_its_time_limit(tmp_path: Path) -> None:
    text = "steps: []\nname: " + json.dumps(list(range(20_000))) + "\n"
    with pytest.raises(PlanInvalid) as raised:
        plan_document(text, "slow.yaml", time_limit=0.0)
    assert "reading the document took longer than 0 s" in str(raised.value)
    assert plan_document(text, "slow.yaml", time_limit=None)["name"][-1] == 19_999
