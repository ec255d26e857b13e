"""``planweave bench control`` and ``planweave control run``: the rows the issue asks for, measured in simulation,
and a control run from a file (its live view, its report, a resume, bad settings named)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from planweave.bench.control import reaction_times, run_one
from planweave.cli.main import app


def invoke(*args: str) -> Any:
    return CliRunner(env={"COLUMNS": "160", "NO_COLOR": "1"}).invoke(app, list(args))


def test_bench_control_json_has_a_row_per_latency_and_mode() -> None:
    result = invoke("bench", "control", "--json", "--seeds", "1", "--env", "point")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [(r["latency_ms"], r["mode"]) for r in rows] == [
        (lat, mode) for lat in (50, 150, 400) for mode in ("sync", "drop_expired", "rollforward")]
    assert set(rows[0]) == {"env", "latency_ms", "mode", "success", "tracking_error", "reaction_s", "idle_frac",
                            "discarded"}
    by = {(r["latency_ms"], r["mode"]): r for r in rows}
    for lat in (50, 150, 400):
        # acting while thinking: the asynchronous executor idles less and tracks better than stop-and-think
        assert by[(lat, "rollforward")]["idle_frac"] < by[(lat, "sync")]["idle_frac"] / 5
        assert by[(lat, "rollforward")]["tracking_error"] < by[(lat, "sync")]["tracking_error"]
        # chunks inferred for their arrival time need (almost) nothing dropped; those for the past do
        assert by[(lat, "rollforward")]["discarded"] < by[(lat, "drop_expired")]["discarded"] / 10
        assert by[(lat, "sync")]["discarded"] == 0


def test_reaction_is_measured_from_the_disturbance_to_a_chunk_that_saw_it() -> None:
    outcome = run_one("point", 150, "sync", seed=0)
    assert outcome.reaction_s is not None and outcome.reaction_s >= 0.15  # never faster than one inference
    reactions = reaction_times(outcome.report, [10_000], 0.02)
    assert reactions == []  # a disturbance after the run: no response measured


def test_bench_control_rejects_an_unknown_environment() -> None:
    result = invoke("bench", "control", "--env", "moon")
    assert result.exit_code == 2 and "--env 'moon' is not known" in result.output


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_control_run_shows_the_live_view_and_the_report(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", f"""env: point
env_options: {{seed: 1, duration: 3}}
policy: {{latency_ms: 150}}
realign: rollforward
journal: sqlite:///{tmp_path / 'c.db'}
""")
    result = invoke("control", "run", str(config), "--live-every", "50")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("tick      0  lateness   0.00 ms  holding")
    assert any("chunk" in line and "age" in line for line in lines[1:3])
    assert "done after 150 ticks" in lines[-1]


def test_control_run_json_and_resume_of_a_finished_run(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", f"env_options: {{duration: 1}}\njournal: sqlite:///{tmp_path / 'c.db'}\n")
    result = invoke("control", "run", str(config), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["status"] == "done" and summary["ticks"] == 50
    again = invoke("control", "run", str(config), "--resume", summary["run_id"])
    assert again.exit_code == 2 and "it finished" in again.output


@pytest.mark.parametrize(("text", "message"), [
    ("rate_hz: fast\n", "'rate_hz' must be a number, got 'fast'"),
    ("env: moon\n", "env 'moon' is not known"),
    ("horizn: 4\n", "unknown setting 'horizn'"),
    ("policy: {latency: 3}\n", "unknown setting 'policy.latency'"),
    ("realign: backwards\n", "realign 'backwards' is not known"),
    ("horizon: 4\nexecute: 8\n", "execute=8: must be between 1 and horizon=4"),
])
def test_control_run_names_a_bad_setting(tmp_path: Path, text: str, message: str) -> None:
    result = invoke("control", "run", str(write(tmp_path / "bad.yaml", text)))
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_a_disturbance_monitor_shortens_the_reaction() -> None:
    plain = run_one("point", 150, "rollforward", seed=0)
    watched = run_one("point", 150, "rollforward", seed=0, monitor=True)
    assert plain.reaction_s is not None and watched.reaction_s is not None
    assert watched.reaction_s < 0.7 * plain.reaction_s
    assert watched.report.requested > plain.report.requested  # a chunk asked for at each detected push


def test_cartpole_without_the_control_extra_names_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = write(tmp_path / "c.yaml", "env: cartpole\n")
    code = ("import sys\nsys.modules['gymnasium'] = None\n"
            f"sys.argv = ['planweave', 'control', 'run', {str(config)!r}]\n"
            "from planweave.cli.main import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "the CartPole environment needs the 'control' extra: pip install 'planweave[control]'" in proc.stderr
    assert "Traceback" not in proc.stderr
