"""The benchmarks parse their command lines with Typer (``planweave.bench.cli``): values, help and bad options."""

from __future__ import annotations

import importlib

import pytest

from planweave.bench import engine as bench_engine
from planweave.bench import planning as bench_planning
from planweave.bench.cli import parse_command_line


def test_engine_options_become_settings() -> None:
    settings, as_json = bench_engine.parse_args(
        ["--quick", "--systems", "floor,pw-null", "--sections", "overhead", "--sizes", "1_000,2000", "--json"])
    assert settings.sizes == (1000, 2000)
    assert settings.systems == ("floor", "pw-null")
    assert settings.sections == frozenset({"overhead"})
    assert (settings.repeats, settings.budget, as_json) == (1, 10.0, True)
    defaults, as_json = bench_engine.parse_args([])
    assert (defaults.sizes, defaults.repeats, as_json) == ((1_000, 10_000), 3, False)


@pytest.mark.parametrize(("argv", "named"), [
    (["--sizes", "10"], "--sizes"),
    (["--systems", "planweave"], "--systems"),
    (["--repeats", "0"], "--repeats"),
    (["--no-such-option"], "--no-such-option"),
])
def test_a_bad_engine_option_exits_2_naming_it(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_engine.parse_args(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_help_exits_0_with_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_planning.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "planweave bench planning" in out and "--step-ms" in out


def test_a_bad_planning_option_exits_2_before_measuring(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_planning.main(["--goals", "0"])
    assert exited.value.code == 2
    assert "--goals" in capsys.readouterr().err


@pytest.mark.parametrize(("module", "argv", "named"), [
    ("admission", ["--runs", "0"], "--runs"),
    ("admission", ["--rate", "0"], "--rate"),
    ("admission", ["--knee", "10", "--hard-limit", "5"], "--hard-limit"),
    ("admission", ["--modes", ""], "--modes"),
    ("admission", ["--no-such-option"], "--no-such-option"),
    ("scale", ["--runs", "0"], "--runs"),
    ("scale", ["--steps", "0"], "--steps"),
    ("scale", ["--sleep", "-1"], "--sleep"),
    ("scale", ["--no-such-option"], "--no-such-option"),
    ("workers", ["--workers", "0,2"], "--workers"),
    ("workers", ["--workers", "one"], "--workers"),
    ("workers", ["--steps", "2"], "--steps"),
    ("workers", ["--lease", "0"], "--lease"),
    ("workers", ["--no-such-option"], "--no-such-option"),
])
def test_a_bad_benchmark_option_exits_2_naming_it(module: str, argv: list[str], named: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Exits before measuring anything: no server started, no PostgreSQL needed.
    main = importlib.import_module(f"planweave.bench.{module}").main
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(("module", "options"), [
    ("admission", ("--runs", "--rate", "--knee", "--hard-limit", "--fixed", "--ttft", "--tps", "--modes", "--json")),
    ("scale", ("--runs", "--steps", "--sleep", "--journal", "--listing", "--no-cli", "--json")),
    ("workers", ("--pg", "--runs", "--steps", "--sleep", "--workers", "--lease", "--max-runs", "--json")),
])
def test_benchmark_help_lists_every_option(module: str, options: tuple[str, ...],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"planweave.bench.{module}").main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert f"planweave bench {module}" in out
    assert [o for o in options if o not in out] == []


def test_workers_options_read_the_pg_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from planweave.bench import workers

    monkeypatch.setenv("PLANWEAVE_TEST_PG", "postgresql://example.invalid/db")
    got = parse_command_line(workers._options, ["--workers", "2, 4", "--json"], "planweave bench workers")
    assert (got.pg, got.workers, got.json) == ("postgresql://example.invalid/db", (2, 4), True)
    got = parse_command_line(workers._options, ["--pg", "postgresql://h/x"], "planweave bench workers")
    assert (got.pg, got.workers, got.runs, got.lease) == ("postgresql://h/x", (1, 3), 200, 2.0)
