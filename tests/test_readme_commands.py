"""Every command block of the README and of docs/*.md runs, as a user would type it, so a broken README fails CI
(issue 27).

The blocks are read from the documents themselves (fenced ``bash``/``sh`` blocks, and untagged ones showing a
``planweave`` command). Each block is one test case, named ``DOC:title`` after the heading or bold lead above it; its
commands run in order as real processes in a fresh working directory (a copy of ``examples/``, a ``data/`` folder,
the files its ``Scene`` writes), sharing one SQLite journal (``PLANWEAVE_JOURNAL``) like a user's session.
Placeholders are filled in the way a user would: ``RUN_ID`` is the id the previous ``run`` printed, ``plan.yaml`` a
real plan, ``npx <package>`` what scripts/install-mcp-servers.sh installed, ``cmd &  sleep 2; kill -9 %1`` starts,
waits and SIGKILLs, a command "in another terminal" runs once the run before it shows what it waits for, ``serve``
is asked ``/healthz`` and stopped with Ctrl-C. Model commands (``--model gpt-4o-mini``, a goal's default model) call
the scripted OpenAI-compatible server on 127.0.0.1 (``OPENAI_BASE_URL``), never a real endpoint. Each command must
end with the exit code the documents imply: 0 unless ``Scene.exits`` says otherwise; with ``--json``, stdout must
parse as JSON.

What CI cannot run (a package index, a Ray cluster, workers on a shared PostgreSQL, benchmarks, the test suite
itself) is listed in ``SKIPPED`` by block and command with the reason, and
``test_every_command_is_run_or_skipped_for_a_reason`` fails on any command of the documents that is neither: a new
README command comes with its coverage.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from planweave.cli.inspect_cmd import read_run
from planweave.cli.run_cmd import DEFAULT_GOAL_MODEL
from planweave.core.errors import RunNotFound
from planweave.testing.scripted_llm import ScriptedLLM
from planweave.testing.scripted_planner import ScriptedPlanner
from tests.threaded_llm import ThreadedLLM

REPO = Path(__file__).resolve().parents[1]
QUICKSTARTS = ("README.md", "docs/offline.md", "docs/tools.md", "docs/forecast.md", "docs/scaling.md")
DOCUMENTS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))
COMMAND_LANGUAGES = ("bash", "sh", "shell", "console")
WAIT_S = 120.0  # for one command, a step's state or a server: generous, two shared cores can be slow
NPX = {"npx -y @modelcontextprotocol/server-filesystem": "mcp-server-filesystem",
       "npx @modelcontextprotocol/inspector": "mcp-inspector"}
"""``npx`` packages the documents run -> the program scripts/install-mcp-servers.sh installs (npx would download)."""


# -- the blocks, as the documents show them -------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """One command line of a block: continuation lines joined, its trailing comment apart."""

    code: str
    comment: str
    line: int

    @property
    def text(self) -> str:
        """The command as written, whitespace collapsed: how ``SKIPPED`` and ``Scene`` name it."""
        return " ".join(self.code.split())


@dataclass(frozen=True)
class Block:
    """A fenced command block of a document, named ``DOC:title`` after the heading or bold lead above it."""

    id: str
    doc: str
    line: int
    commands: tuple[Command, ...]


def split_comment(line: str) -> tuple[str, str]:
    """``line`` cut at its shell comment (a ``#`` outside quotes, at the start or after a blank)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def block_commands(lines: list[str], first_line: int) -> tuple[Command, ...]:
    """The commands of a block's ``lines`` (comment lines and blank lines dropped, ``\\`` continuations joined)."""
    commands: list[Command] = []
    pending: list[str] = []
    start = first_line
    for number, raw in enumerate(lines, first_line):
        code, comment = split_comment(raw.strip())
        if not pending:
            start = number
        if code.endswith("\\"):
            pending.append(code.removesuffix("\\").strip())
            continue
        if code or pending:
            commands.append(Command(" ".join([*pending, code]).strip(), comment, start))
        pending = []
    return tuple(commands)


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def read(doc: str) -> str:
    return (REPO / doc).read_text(encoding="utf-8")


def fenced_blocks(markdown: str) -> Iterator[tuple[str, str, int, list[str]]]:
    """Every fenced block of ``markdown``: (language, title above it, line of its first line, its lines)."""
    title = ""
    lines = markdown.splitlines()
    number = 0
    while number < len(lines):
        line, after_blank = lines[number], number == 0 or not lines[number - 1].strip()
        number += 1
        if line.startswith("```"):
            language, body, first = line[3:].strip(), [], number + 1
            while number < len(lines) and not lines[number].startswith("```"):
                body.append(lines[number])
                number += 1
            number += 1
            yield language, title, first, body
        elif line.startswith("#"):
            title = line.lstrip("#").strip()
        elif (bold := re.match(r"\*\*(.+?)\*\*(:?)", line)) and (after_blank or bold.group(2)):
            title = bold.group(1)  # a paragraph's bold lead ("**Crash and resume.**"), not a bold word


def command_blocks(doc: str, markdown: str) -> list[Block]:
    """The command blocks of ``doc`` (its text: ``markdown``): ``bash``/``sh`` blocks, and untagged ones showing a
    ``planweave`` command."""
    blocks: list[Block] = []
    seen: dict[str, int] = {}
    for language, title, first, body in fenced_blocks(markdown):
        commands = block_commands(body, first)
        shows_planweave = any(c.code.startswith("planweave ") for c in commands)
        if language not in COMMAND_LANGUAGES and not (language == "" and shows_planweave):
            continue
        name = f"{doc}:{slug(title) or 'top'}"
        seen[name] = seen.get(name, 0) + 1
        blocks.append(Block(name if seen[name] == 1 else f"{name}-{seen[name]}", doc, first, commands))
    return blocks


def doc_code(doc: str, contains: str) -> str:
    """The text of the one fenced block of ``doc`` containing ``contains`` (a file the documents show)."""
    found = ["\n".join(body) + "\n" for _, _, _, body in fenced_blocks(read(doc)) if contains in "\n".join(body)]
    assert len(found) == 1, f"{doc}: {len(found)} blocks contain {contains!r}, expected one"
    return found[0]


BLOCKS = [block for doc in DOCUMENTS for block in command_blocks(doc, read(doc))]


# -- what CI cannot run, and how the others are set up --------------------------------------------------------------
PIP = "installs packages from an index: CI installs the checkout with scripts/setup.sh and checks the wheel, without " \
      "extras in a fresh venv, with scripts/check-wheel.sh"
WORKERS = "workers on a shared PostgreSQL journal (a database host, long-running workers, mypkg's tools): " \
          "tests/workers/ runs them for real"
BENCH = "a benchmark: minutes of CPU on two shared cores (and peers, data sets); tests/bench/ runs each small"
RAY = "a Ray cluster (ray start, pip install of the [ray] extra): tests/ray/ runs steps on a real cluster"

def skips(block: str, reason: str, *commands: str) -> dict[tuple[str, str], str]:
    return {(block, command): reason for command in commands}


SKIPPED: dict[tuple[str, str], str] = {
    **skips("README.md:two-commands", "sets the .venv up (pip install -e '.[dev]'); its two commands are the tour's "
            "`planweave run examples/hello.yaml` and docs/offline.md's first command, both run here",
            "./scripts/demo.sh"),
    **skips("README.md:two-commands", "the whole test suite, this test included", "./scripts/test.sh"),
    **skips("README.md:install", PIP,
            "pip install .", "pip install '.[server]'", "pip install '.[postgres]'", "pip install '.[mcp]'",
            "pip install '.[telemetry]'", "pip install '.[local]'", "pip install '.[ray]'"),
    **skips("docs/tools.md:connecting-mcp-servers",
            "needs a browser MCP server listening on 127.0.0.1:8931 (the example's `web`); the README's "
            "`planweave run plan.yaml --mcp fs=...` runs the filesystem half",
            'planweave run plan.yaml --mcp fs="npx -y @modelcontextprotocol/server-filesystem ./data" '
            "--mcp web=http://127.0.0.1:8931/mcp"),
    **skips("docs/scaling.md:listing-runs-stays-fast-however-big-the-journal",
            "not a planweave command: GET /runs of a running server with its token ($T); tests/server/ covers it",
            """curl -H "Authorization: Bearer $T" '127.0.0.1:8765/runs?status=running&since=2h&limit=50'"""),
    **skips("docs/speculation.md:speculative-steps", BENCH, "planweave bench speculate"),
    **skips("docs/benchmarks.md:how-to-run", BENCH,
            "planweave bench asynchow ../shared/data/asynchow", "planweave bench engine",
            "planweave bench engine --quick --skip-peers", "planweave bench engine --json > engine.json",
            "benchmarks/run_all.sh"),
    **skips("docs/protocols.md:long-runs",
            "the Inspector against a `planweave serve` running on 8765, with its token (TOKEN); "
            "tests/server/test_mcp_server_inspector.py runs it",
            'npx @modelcontextprotocol/inspector --cli http://127.0.0.1:8765/mcp --transport http '
            '--header "Authorization: Bearer TOKEN" --method tools/list'),
    **skips("docs/scaling.md:workers-on-one-postgresql-journal", WORKERS,
            "export PLANWEAVE_JOURNAL='postgresql://user@db:5432/planweave?schema=team_a'",
            'planweave worker --name "$(hostname)" --tools mypkg.tools:toolbox --workdir /srv/work --max-runs 16 '
            "--lease 10",
            "planweave submit plan.yaml --tools mypkg.tools:toolbox", "planweave show RUN_ID", "planweave workers",
            "planweave serve --queue --tools mypkg.tools:toolbox"),
    **skips("docs/scaling.md:steps-on-ray", RAY,
            "pip install -e '.[ray]'", "ray start --head --num-cpus 8", "export RAY_ADDRESS=HOST:PORT",
            "planweave run plan.yaml --config executor=ray --tools mypkg.tools:toolbox",
            "planweave resume ID --config executor=ray",
            "planweave worker --journal postgresql://... --executor ray --tools mypkg.tools:toolbox"),
    **skips("docs/models.md:a-local-endpoint",
            "needs an Ollama server on 127.0.0.1:11434; tests/models/test_local_model.py runs the llama.cpp server "
            "(the [local] extra) as the real OpenAI-compatible endpoint",
            'planweave goal "What is the weather in Oslo?" --model llama3.1:8b --base-url http://127.0.0.1:11434/v1'),
}
"""Commands CI does not run, by (block, text as written), with the reason."""

ACTIVATE = "source .venv/bin/activate"  # the venv's scripts come first on every command's PATH
KILL = re.compile(r"^(?P<command>planweave .+?)\s+&\s+sleep (?P<seconds>[\d.]+);\s*kill -9 %1$")
SHELL = re.compile(r"^rm -rf (?P<dir>\S+) && cp -r (?P<source>\S+) (?P=dir)$")  # a fresh copy of an example
FETCH = "planweave run fetch.yaml --tools examples.research_agent:toolbox"  # history of http.get, offline
FETCH_PLAN = """\
# A page fetched with http.get from the small site the research agent's toolbox serves on 127.0.0.1.
steps:
  - {id: site, tool: site.serve}
  - {id: page, tool: http.get, args: {url: "${site.url}"}}
"""
GEOCODE_PLAN = """\
# docs/caching.md's plan without its step on the network (https://example.test)
steps:
  - {id: where, tool: geocode, args: {city: Oslo}}
  - {id: now, tool: geocode, args: {city: Oslo}, cache: false}
"""
WEATHER_REPORT = """\
# The planner's answers for docs/memory.md's goals, and its distillation: a skill, admitted once its replay succeeds
plan:
  - {id: report, tool: noop, args: {city: oslo, temp: 12}}
answer: "12 degrees in Oslo."
llm: '{"kind": "skill", "name": "city-report", "text": "A weather report for a city.", "steps": [{"id": "report",
  "tool": "noop", "args": {"city": "${city}"}}], "params": {"city": "oslo"}, "steps_used": ["report"]}'
"""
TIERED_PLAN = """\
# an llm step the allocator gives a tier, and one a cascade escalates (docs/allocation.md)
pressure: {p_deadline: 0.5, actions: [faster_tiers, drop_optional, replan]}
steps:
  - {id: draft, tool: llm, args: {prompt: "Draft a one-line summary.", model: auto, tiers: [small, medium, large]}}
  - {id: check, tool: llm, args: {prompt: "Check: ${draft.text}", model: cascade, tiers: [small, medium, large]}}
"""
ANSWERS = """\
# what a goal's planner and every llm step answer (docs/allocation.md's commands)
plan:
  - {id: note, tool: noop, args: {text: done}}
llm: "ok"
"""
CONTROL = "env: point\nenv_options: {seed: 1, duration: 2}\npolicy: {latency_ms: 150}\nrealign: rollforward\n"
KILLED_RESEARCH = "planweave run examples/research.yaml & sleep 2; kill -9 %1"
MCP_PLAN = doc_code("docs/tools.md", "- id: notes")  # reads ./data/notes.md through the server


@dataclass(frozen=True)
class Scene:
    """What a block's user has in front of them: files, earlier commands, a model, and the codes the docs imply."""

    replace: Mapping[str, str] = field(default_factory=dict)
    """Placeholder -> what the user types instead (``{work}``: the working directory); ``RUN_ID`` is always the id
    the previous ``run`` printed."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Files written in the working directory first (``plan.yaml``, a tool module)."""
    before: tuple[str, ...] = ()
    """Commands run first: how the user got where the block starts (a history of runs, a killed run)."""
    model: str | None = None
    """A planner's script (in the working directory) served as the OpenAI endpoint (``OPENAI_BASE_URL``) for the
    block's ``--model NAME`` (none: the default model)."""
    alternatives: bool = False
    """The block's first command sets the scene and each other command is another way on from it: the first command
    runs again before each of them but the first."""
    exits: Mapping[str, int] = field(default_factory=dict)
    """Commands that end with another code than 0, as the documents say."""


SCENES: dict[str, Scene] = {
    "README.md:crash-and-resume": Scene(alternatives=True),
    "README.md:goals-with-a-model": Scene(model="examples/offline/weather.yaml"),
    "README.md:tools": Scene(files={"plan.yaml": MCP_PLAN}),
    "docs/tools.md:writing-a-python-tool": Scene(files={
        "mytools.py": doc_code("docs/tools.md", "# mytools.py"),
        "plan.yaml": "steps:\n  - {id: count, tool: text.count, args: {text: three words here}}\n",
    }),
    "docs/offline.md:example-agents": Scene(replace={"/tmp/research-notes": "{work}/research-notes",
                                                     "/tmp/stats-project": "{work}/stats-project"}),
    "docs/forecast.md:estimates-and-forecasts": Scene(replace={"plan.yaml": "examples/research.yaml"},
                                                      files={"fetch.yaml": FETCH_PLAN},
                                                      before=(FETCH, KILLED_RESEARCH)),
    "docs/caching.md:the-result-cache": Scene(files={
        "mytools.py": doc_code("docs/caching.md", "cache=True").replace(
            "    ...\n", '    """Where a city is."""\n    return {"lat": 59.91, "lon": 10.75}\n'),
        "plan.yaml": GEOCODE_PLAN,
    }),
    "docs/control.md:acting-while-thinking-the-control-loop-planweave-control": Scene(
        replace={"CONFIG.yaml": "control.yaml", " [--live-every 50] [--resume RUN_ID] [--json]": ""},
        files={"control.yaml": CONTROL}),
    **dict.fromkeys(["docs/allocation.md:the-tier-table", "docs/allocation.md:cascades-and-monitors",
                     "docs/allocation.md:deadline-pressure"], Scene(
        replace={"--model M ": "--model gpt-4o-mini "},
        files={"plan.yaml": TIERED_PLAN, "tiers.yaml": doc_code("docs/allocation.md", "# tiers.yaml"),
               "answers.yaml": ANSWERS},
        model="answers.yaml")),
    "docs/memory.md:memory-across-runs": Scene(files={"planner.yaml": WEATHER_REPORT}, model="planner.yaml"),
    **dict.fromkeys(["docs/models.md:openai", "docs/models.md:anthropic"],  # the scripted server speaks each dialect
                    Scene(files={"answers.yaml": ANSWERS}, model="answers.yaml")),
    "docs/speculation.md:speculative-steps": Scene(replace={"plan.yaml": "examples/hello.yaml"}),
    "docs/scaling.md:one-process": Scene(replace={"plan.yaml": "examples/hello.yaml"}),
    "docs/scaling.md:listing-runs-stays-fast-however-big-the-journal": Scene(
        before=("planweave run examples/hello.yaml",)),
}


def skip_reason(block: Block, command: Command) -> str | None:
    return SKIPPED.get((block.id, command.text))


def runnable(command: Command) -> bool:
    """Whether this test knows how to type ``command`` (else it must be skipped for a reason)."""
    return (command.text.startswith(("planweave ", *NPX)) or command.text == ACTIVATE
            or KILL.match(command.text) is not None or SHELL.match(command.text) is not None)


# -- a user's terminal ----------------------------------------------------------------------------------------------
def installed(program: str) -> str:
    """A program scripts/install-mcp-servers.sh installed (an MCP server, the Inspector), as a user's ``npx`` runs."""
    cache = Path(os.environ.get("PLANWEAVE_MCP_CACHE", REPO / ".cache" / "mcp"))
    path = cache / "node_modules" / ".bin" / program
    if not path.exists():
        pytest.fail(f"{program} is not installed in {cache}: run scripts/install-mcp-servers.sh", pytrace=False)
    assert not any(c.isspace() for c in str(path)), f"{path}: a path with blanks cannot stand in a --mcp command"
    return str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


STARTED = re.compile(r"^run (\S+) started\b", re.MULTILINE)


@dataclass
class Background:
    """A run left running "in another terminal" (its output in files), and the run id it was given."""

    proc: subprocess.Popen[bytes]
    command: Command
    run_id: str
    output: Path


class Terminal:
    """A user's shell for one block: the working directory, the journal, the last run id, a run in the background."""

    def __init__(self, block: Block, scene: Scene, work: Path, env: dict[str, str]) -> None:
        self.block, self.scene, self.work, self.env = block, scene, work, env
        self.journal = env["PLANWEAVE_JOURNAL"]
        self.last_run_id: str | None = None
        self.background: Background | None = None

    # typing a line
    def words(self, command: Command, code: str | None = None) -> list[str]:
        """``command`` (or a part of it, ``code``) with its placeholders filled as a user would, split as the shell
        splits it."""
        code = command.code if code is None else code
        for old, new in self.scene.replace.items():
            code = code.replace(old, new.format(work=self.work))
        for npx, program in NPX.items():
            code = code.replace(npx, installed(program)) if npx in code else code
        if "RUN_ID" in code:
            assert self.last_run_id is not None, f"{command.text}: no run printed its id before it"
            code = code.replace("RUN_ID", self.last_run_id)
        return shlex.split(code)

    @staticmethod
    def process(words: list[str]) -> list[str]:
        """What runs for ``words``: ``planweave`` is the CLI of this interpreter (the venv's, the build under test)."""
        return [sys.executable, "-m", "planweave.cli.main", *words[1:]] if words[0] == "planweave" else words

    def expected(self, command: Command) -> int:
        return self.scene.exits.get(command.text, 0)

    def fail(self, command: Command, why: str, out: str = "", err: str = "") -> None:
        pytest.fail(f"{self.block.id}, line {command.line}: `{command.text}` {why}\n--- stdout\n{tail(out)}\n"
                    f"--- stderr\n{tail(err)}", pytrace=False)

    def type(self, command: Command) -> None:
        """Run ``command`` to its end and check its exit code (and, with ``--json``, one JSON document on stdout)."""
        if command.text == ACTIVATE:
            return
        if kill := KILL.match(command.text):
            self.kill_after(command, kill["command"], float(kill["seconds"]))
            return
        if shell := SHELL.match(command.text):
            self.fresh_copy(command, shell["dir"], shell["source"])
            return
        words = self.words(command)
        if words[:2] == ["planweave", "serve"]:
            self.serve(command, words)
            return
        self.wait_for_background_step(command, words)
        done = subprocess.run(self.process(words), cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=WAIT_S, stdin=subprocess.DEVNULL)
        if done.returncode != self.expected(command):
            self.fail(command, f"exited {done.returncode}, the documents imply {self.expected(command)}",
                      done.stdout, done.stderr)
        if "--json" in words:
            try:
                json.loads(done.stdout)
            except json.JSONDecodeError:
                self.fail(command, "printed no single JSON document on stdout", done.stdout, done.stderr)
        self.note_run_id(done.stdout + done.stderr)

    def note_run_id(self, output: str) -> None:
        if started := STARTED.search(output):
            self.last_run_id = started.group(1)

    def kill_after(self, command: Command, run: str, seconds: float) -> None:
        """``run &  sleep N; kill -9 %1``: the run started, ``N`` s after it printed its id, killed with SIGKILL."""
        proc = subprocess.Popen(self.process(self.words(command, run)), cwd=self.work, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, stdin=subprocess.DEVNULL)
        try:
            assert proc.stdout is not None
            seen = ""
            while not STARTED.search(seen):  # the id, then `sleep 2` (a loaded machine may take seconds to start)
                line = proc.stdout.readline()
                if not line:
                    self.fail(command, f"ended ({proc.wait()}) before printing its run id", seen)
                seen += line
            self.note_run_id(seen)
            time.sleep(seconds)
            if proc.poll() is not None:
                self.fail(command, f"had ended ({proc.returncode}) before the kill", seen)
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(WAIT_S)
            if proc.stdout is not None:
                proc.stdout.close()

    def fresh_copy(self, command: Command, directory: str, source: str) -> None:
        """``rm -rf DIR && cp -r SOURCE DIR``, with DIR moved into the working directory by the scene."""
        target = Path(self.words(command, directory)[0])
        assert target.is_relative_to(self.work), f"{command.text}: {target} is outside the working directory"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self.work / source, target)

    def serve(self, command: Command, words: list[str]) -> None:
        """A server: started (on a free port: the machine is shared, not on 8765), answering ``/healthz``, then
        stopped with Ctrl-C (SIGINT), ending with 0."""
        port = free_port()
        proc = subprocess.Popen(self.process([*words, "--port", str(port)]), cwd=self.work, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        out = ""
        try:
            assert proc.stdout is not None
            while f"serving http://127.0.0.1:{port}/" not in out:
                line = proc.stdout.readline()
                if not line:
                    self.fail(command, f"ended ({proc.wait()}) without serving", out)
                out += line
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=WAIT_S) as answer:
                assert answer.status == 200
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=WAIT_S)
            if proc.returncode != self.expected(command):
                self.fail(command, f"exited {proc.returncode} on Ctrl-C", out + rest)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(WAIT_S)

    # another terminal
    def start_in_background(self, command: Command) -> None:
        """A ``run`` whose next command is typed "in another terminal": started, and left running."""
        words = self.words(command)
        assert "--run-id" in words, f"{command.text}: a run left in the background needs --run-id to be named"
        output = self.work / f"background-{command.line}.out"
        with output.open("wb") as sink:
            proc = subprocess.Popen(self.process(words), cwd=self.work, env=self.env, stdout=sink,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.background = Background(proc, command, words[words.index("--run-id") + 1], output)
        self.last_run_id = self.background.run_id

    def wait_for_background_step(self, command: Command, words: list[str]) -> None:
        """Before ``approve RUN STEP`` or ``output RUN STEP`` of the run in the background: what the user waits to
        see in its live view (the step waiting for approval, or its output there)."""
        bg = self.background
        if bg is None or len(words) < 4 or words[1] not in ("approve", "output") or words[2] != bg.run_id:
            return
        step, want = words[3], "waiting_approval" if words[1] == "approve" else "succeeded"
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if bg.proc.poll() is not None:
                self.fail(bg.command, f"ended ({bg.proc.returncode}) before step '{step}' was {want}",
                          bg.output.read_text(errors="replace"))
            try:
                state = asyncio.run(read_run(self.journal, bg.run_id)).state
            except RunNotFound:
                state = None
            record = state.records.get(step) if state is not None else None
            if record is not None and record.status == want:
                return
            time.sleep(0.2)
        self.fail(command, f"waited {WAIT_S:.0f} s for step '{step}' to be {want}")

    def join_background(self) -> None:
        """The run in the background, once the other terminal is done with it: it ends with its expected code."""
        bg, self.background = self.background, None
        if bg is None:
            return
        try:
            code = bg.proc.wait(WAIT_S)
        finally:
            if bg.proc.poll() is None:
                bg.proc.kill()
                bg.proc.wait(WAIT_S)
        if code != self.expected(bg.command):
            self.fail(bg.command, f"exited {code}, the documents imply {self.expected(bg.command)}",
                      bg.output.read_text(errors="replace"))

    def names_background(self, command: Command) -> bool:
        return self.background is not None and self.background.run_id in command.text.split()


@contextmanager
def terminal(block: Block, scene: Scene, tmp_path: Path) -> Iterator[Terminal]:
    """A fresh checkout's working directory (``examples/``, ``data/``, the scene's files), its journal, its model."""
    work = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__", ".*cache"))
    (work / "data").mkdir()
    (work / "data" / "notes.md").write_text("# Notes\n\nDurable execution journals every step.\n", encoding="utf-8")
    for name, text in scene.files.items():
        (work / name).write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PLANWEAVE_", "OPENAI_", "ANTHROPIC_", "OTEL_")) or k == "PLANWEAVE_MCP_CACHE"}
    env |= {"PLANWEAVE_JOURNAL": f"sqlite:///{tmp_path / 'runs.db'}", "COLUMNS": "160",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])}
    with ExitStack() as stack:
        if scene.model is not None:
            planner = ScriptedPlanner.load(work / scene.model)
            models = {c.code.split("--model ")[1].split()[0] for c in block.commands if "--model " in c.code}
            models = models or {DEFAULT_GOAL_MODEL}
            server = stack.enter_context(ThreadedLLM(ScriptedLLM(planner.reply, models=tuple(models))))
            env |= {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-scripted-not-a-key",
                    "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-scripted-not-a-key"}  # every dialect
        user = Terminal(block, scene, work, env)
        try:
            yield user
        finally:
            if user.background is not None and user.background.proc.poll() is None:
                user.background.proc.kill()
                user.background.proc.wait(WAIT_S)


def in_another_terminal(command: Command) -> bool:
    return "another terminal" in command.comment


# -- the tests ------------------------------------------------------------------------------------------------------
def test_the_documents_show_their_command_blocks() -> None:
    found = {block.doc for block in BLOCKS}
    assert set(QUICKSTARTS) <= found, f"no command block found in {sorted(set(QUICKSTARTS) - found)}"
    ids = [block.id for block in BLOCKS]
    assert len(ids) == len(set(ids))


def uncovered(blocks: list[Block]) -> list[str]:
    """The commands of ``blocks`` that this test neither runs nor skips for a reason."""
    return [f"{block.id}, line {c.line}: {c.text}" for block in blocks for c in block.commands
            if skip_reason(block, c) is None and not runnable(c)]


def test_a_block_joins_continued_lines_and_keeps_comments_apart() -> None:
    commands = block_commands([
        'planweave run --goal "a # not a comment" \\',
        "    --model m      # the model",
        "",
        "# a line of comment",
        """planweave send R ask --value '{"n": "#1"}'""",
    ], 10)
    assert [(c.code, c.comment, c.line) for c in commands] == [
        ('planweave run --goal "a # not a comment" --model m', "the model", 10),
        ("""planweave send R ask --value '{"n": "#1"}'""", "", 14),
    ]


def test_blocks_are_named_by_the_heading_or_bold_lead_above_them() -> None:
    markdown = "\n".join([
        "# Top", "```bash", "planweave runs", "```",
        "", "**Crash and resume.** Kill a run", "and **bold** inside a line is no title:", "```bash",
        "planweave resume RUN_ID", "```",
        "```python", "planweave = 1", "```",
        "```", "planweave show RUN_ID", "```",
        "```", "output, not a command", "```",
    ])
    assert [(b.id, [c.text for c in b.commands]) for b in command_blocks("d.md", markdown)] == [
        ("d.md:top", ["planweave runs"]),
        ("d.md:crash-and-resume", ["planweave resume RUN_ID"]),
        ("d.md:crash-and-resume-2", ["planweave show RUN_ID"]),
    ]


def test_a_new_command_without_a_way_to_run_it_or_a_reason_to_skip_it_is_named() -> None:
    block = Block("README.md:install", "README.md", 26, (Command("pip install .", "", 27),
                                                         Command("docker run planweave", "", 28)))
    assert uncovered([block]) == ["README.md:install, line 28: docker run planweave"]


@pytest.mark.timeout(120)
def test_a_broken_command_fails_naming_its_block_line_and_exit_code(tmp_path: Path) -> None:
    typo = Command("planweave run examples/helo.yaml", "live view of the steps", 45)
    block = Block("README.md:a-five-minute-tour", "README.md", 43, (typo,))
    with terminal(block, Scene(), tmp_path) as user, pytest.raises(pytest.fail.Exception) as failed:
        user.type(typo)
    assert str(failed.value).startswith("README.md:a-five-minute-tour, line 45: `planweave run examples/helo.yaml` "
                                        "exited 2, the documents imply 0")


def test_every_command_is_run_or_skipped_for_a_reason() -> None:
    missing = uncovered(BLOCKS)
    assert not missing, "commands neither run nor skipped (add them to SKIPPED with the reason):\n" + \
        "\n".join(missing)
    shown = {(block.id, c.text) for block in BLOCKS for c in block.commands}
    assert not set(SKIPPED) - shown, f"skips of commands no block shows: {sorted(set(SKIPPED) - shown)}"
    ids = {block.id for block in BLOCKS}
    assert not set(SCENES) - ids, f"scenes of blocks no document has: {sorted(set(SCENES) - ids)}"
    texts = {c.text for block in BLOCKS for c in block.commands}
    exits = {command for scene in SCENES.values() for command in scene.exits}
    assert not exits - texts, f"exit codes of commands no document shows: {sorted(exits - texts)}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_a_command_block_runs_as_the_documents_say(block: Block, tmp_path: Path) -> None:
    skipped = {c.text: reason for c in block.commands if (reason := skip_reason(block, c)) is not None}
    to_run = [c for c in block.commands if c.text not in skipped]
    if not to_run:
        by_reason: dict[str, list[str]] = {}
        for text, reason in skipped.items():
            by_reason.setdefault(reason, []).append(f"`{text}`")
        pytest.skip("; ".join(f"{', '.join(texts)}: {reason}" for reason, texts in by_reason.items()))
    scene = SCENES.get(block.id, Scene())
    with terminal(block, scene, tmp_path) as user:
        for text in scene.before:
            user.type(Command(text, "", 0))
        for i, command in enumerate(to_run):
            if user.background is not None and not user.names_background(command):
                user.join_background()
            if scene.alternatives and i > 1:
                user.type(to_run[0])
            following = to_run[i + 1] if i + 1 < len(to_run) else None
            if command.text.startswith(("planweave run ", "planweave goal ")) and following is not None \
                    and in_another_terminal(following):
                user.start_in_background(command)
            else:
                user.type(command)
        user.join_background()
