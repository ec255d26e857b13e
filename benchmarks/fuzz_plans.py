"""Fuzz the plan loader: N generated plan files through what `planweave run` does before it runs anything.

Each file is read with `load_plan_file` and checked with `validate_plan` against the built-in tools and the plan's
capacities, in-process (no subprocess per file). An input must give a plan or a `PlanError`; anything else is a
crash, printed with its traceback. Exit status 1 if any input crashed.

    .venv/bin/python benchmarks/fuzz_plans.py [-n 500] [--seed 0]
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from planweave import builtin_tools, validate_plan
from planweave.bench.cli import parse_command_line
from planweave.core.errors import PlanError
from planweave.planfile import load_plan_file

VALID = {
    "name": "fuzz",
    "defaults": {"timeout": 30, "retries": 1},
    "capacities": {"browser": 2},
    "steps": [
        {"id": "a", "tool": "noop", "args": {"x": [1, 2, {"y": "z"}]}},
        {"id": "b", "tool": "sleep", "args": {"seconds": 0, "result": "${a.x[2].y}"}, "resources": {"browser": 1},
         "retries": {"max": 2, "backoff": 0.1, "on": ["timeout"]}, "timeout": 5},
        {"id": "c", "tool": "noop", "after": ["a", "b"], "approval": "ok?", "estimate": {"duration": 1}},
    ],
}
ODD_VALUES: list[object] = [None, True, -1, 0, 1e308, float("inf"), float("nan"), "", "\ud800", "${", "${zz}",
                            [], {}, [[[]]], {"max": -1}, 10**40, "a" * 300, {"": None}]
Generator = Callable[[random.Random], tuple[str, bytes]]


def _dump(doc: object, rng: random.Random) -> tuple[str, bytes]:
    if rng.random() < 0.5:
        return ".json", json.dumps(doc).encode("utf-8", "surrogatepass")
    import yaml

    return ".yaml", yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")


def random_bytes(rng: random.Random) -> tuple[str, bytes]:
    return rng.choice([".json", ".yaml"]), rng.randbytes(rng.randrange(0, 400))


def mutated_document(rng: random.Random) -> tuple[str, bytes]:
    doc = json.loads(json.dumps(VALID))
    targets = [doc, *doc["steps"], doc["defaults"]]  # taken before mutations replace them
    for _ in range(rng.randrange(1, 5)):
        target = rng.choice(targets)
        key = rng.choice([*target, "retries", "timeout", "isolation", "on_failure", "zzz"])
        target[key] = rng.choice(ODD_VALUES)
    return _dump(doc, rng)


def mutated_bytes(rng: random.Random) -> tuple[str, bytes]:
    suffix, text = _dump(VALID, rng)
    data = bytearray(text)
    for _ in range(rng.randrange(1, 8)):
        at = rng.randrange(len(data))
        op = rng.randrange(3)
        if op == 0:
            data[at] = rng.randrange(256)
        elif op == 1:
            del data[at]
        else:
            data[at:at] = rng.choice([b"{", b"[", b"&a ", b"*a", b"\\ud800", b"9" * 5000, b"\xff", b"!!set ", b": "])
    return suffix, bytes(data)


def nested(rng: random.Random) -> tuple[str, bytes]:
    depth = rng.choice([50, 99, 100, 101, 500, 1000, 5000, 100_000])
    if rng.random() < 0.5:
        return ".json", b'{"steps": [{"id": "a", "tool": "noop", "args": {"x": ' + b"[" * depth + b"]" * depth + b"}}]}"
    return ".yaml", b"steps: [{id: a, tool: noop, args: {x: " + b"{a: " * depth + b"1" + b"}" * depth + b"}}]"


def known_nasty(rng: random.Random) -> tuple[str, bytes]:
    laughs = b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n".encode() for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    return rng.choice([
        (".yaml", b"steps: [{id: a, tool: noop, args: {x: &a [*a]}}]"),
        (".yaml", b"&a [*a]"),
        (".yaml", b"&a {steps: *a}"),
        (".yaml", laughs + b"steps: [{id: s, tool: noop, args: {v: *i}}]\n"),
        (".json", b'{"steps": [], "concurrency": ' + b"9" * 5000 + b"}"),
        (".yaml", b"steps: [{id: a, tool: noop, timeout: " + b"9" * 5000 + b"}]"),
        (".json", b'{"steps": [{"id": "a", "tool": "noop", "args": {"x": "\\ud800"}}]}'),
        (".yaml", "steps: [{id: caf\xe9, tool: noop}]".encode("latin-1")),
        (".yaml", b"steps: [{id: a, tool: noop, args: {d: 2001-02-30, s: !!set {a}, b: !!binary aGk=}}]"),
        (".json", b'{"steps": [{"id": "a", "tool": "noop", "timeout": Infinity}]}'),
        (".yaml", b"- 1\n- 2\n"),
        (".json", b""),
    ])


GENERATORS: list[Generator] = [random_bytes, mutated_document, mutated_bytes, nested, known_nasty]


def fuzz(count: int, seed: int, folder: Path) -> Counter[str]:
    """Run ``count`` generated files; return counts of outcomes (``plan``, ``PlanError``, ``crash``)."""
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    tools = builtin_tools()
    for index in range(count):
        suffix, content = rng.choice(GENERATORS)(rng)
        path = folder / f"plan{index}{suffix}"
        path.write_bytes(content)
        try:
            spec = load_plan_file(path)
            validate_plan(spec, tools, dict(spec.capacities), source=str(path))
            outcomes["plan"] += 1
        except PlanError:
            outcomes["PlanError"] += 1
        except Exception:  # counting crashes is the point
            outcomes["crash"] += 1
            print(f"--- crash on {path} ({len(content)} bytes): {content[:120]!r}", file=sys.stderr)
            traceback.print_exc()
    return outcomes


def _options(
    n: Annotated[int, typer.Option("-n", min=1, help="number of plan files")] = 500,
    seed: Annotated[int, typer.Option(help="seed of the fuzzer")] = 0,
) -> tuple[int, int]:
    """Fuzz the plan-file loader and validator: a malformed file must be a PlanError, never a crash."""
    return n, seed


def main(argv: list[str] | None = None) -> int:
    count, seed = parse_command_line(_options, argv, "python benchmarks/fuzz_plans.py")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        outcomes = fuzz(count, seed, Path(folder))
    elapsed = time.perf_counter() - started
    print(f"{count} fuzzed plan files in {elapsed:.1f}s: {outcomes['plan']} plans, "
          f"{outcomes['PlanError']} plan errors, {outcomes['crash']} crashed")
    return 1 if outcomes["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
