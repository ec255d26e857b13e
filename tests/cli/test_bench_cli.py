"""The benchmarks parse their command lines with Typer (``planweave.bench.cli``): values, help and bad options."""

from __future__ import annotations

import pytest

from planweave.bench import engine as bench_engine
from planweave.bench import planning as bench_planning


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
