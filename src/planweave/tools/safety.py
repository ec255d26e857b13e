"""Guards for tools that touch the machine: path confinement, an executable allowlist and secret redaction.

Also the ``file.read`` / ``file.write`` / ``file.list`` tools, which only reach files under declared roots, and
``allowlisted_shell``, the ``shell`` tool limited to named executables. These are guards against a plan (often
written by a model) wandering off, not a sandbox: a tool with an allowed interpreter can still do anything the
interpreter can.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex
from typing import Any

import orjson
from pydantic import BaseModel

from planweave.core.context import current_step
from planweave.core.errors import RunError, ToolError
from planweave.core.events import Event
from planweave.tools.builtins import run_program, shell
from planweave.tools.registry import Tool, Toolbox

__all__ = [
    "EXEC_ENV_RULES",
    "OPTION_RULES",
    "ExecPolicy",
    "ExecutableNotAllowed",
    "OptionRule",
    "PathNotAllowed",
    "SafetyError",
    "SecretRedactor",
    "allowlisted_shell",
    "check_argv",
    "confine_path",
    "confined_shell",
    "file_tools",
    "redact",
    "secret_values",
]

READ_LIMIT = 1_000_000  # bytes file.read returns at most; the rest is cut, and said so
WRITE_LIMIT = 10_000_000  # characters file.write accepts
LIST_LIMIT = 10_000  # entries file.list returns at most
MIN_SECRET_LENGTH = 6  # shorter values ("1", "true", "dev") would redact half of every output

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|AUTH", re.IGNORECASE)
"""Environment variable names whose values are secrets (``OPENAI_API_KEY``, ``GITHUB_TOKEN``, ``PGPASSWORD``...)."""
SECRET_NAMES = frozenset({"DATABASE_URL", "PLANWEAVE_TEST_PG", "PGDSN", "SENTRY_DSN", "HF_HUB_TOKEN"})
"""Further names that hold credentials without saying so (connection URLs carry passwords)."""
REDACTED = "***"


class SafetyError(ToolError):
    """A tool call was refused by a safety guard; never retried (the same call would be refused again)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="forbidden", retryable=False)


class PathNotAllowed(SafetyError):
    """A path lies outside every allowed root (through ``..``, an absolute path or a symlink)."""


class ExecutableNotAllowed(SafetyError):
    """A program is not on the run's executable allowlist."""


# -- paths ----------------------------------------------------------------------------------------------------------
def _roots_text(roots: Sequence[Path]) -> str:
    return ", ".join(str(r) for r in roots) or "(none)"


def confine_path(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]) -> Path:
    """Return ``path`` resolved, if it lies under one of ``roots``; raise :class:`PathNotAllowed` otherwise.

    A relative path is taken relative to the first root. Refused: ``..`` that climbs out of the root, absolute paths
    elsewhere, and paths that leave the roots through a symlink (checked on the resolved path, so a link inside a
    root to a place outside it is refused while a link between two roots is fine).
    """
    root_paths = [Path(r).resolve() for r in roots]
    if not root_paths:
        raise PathNotAllowed(f"path '{path}' refused: no root directories are allowed")
    raw = Path(path)
    if str(raw) == "" or "\x00" in str(raw):
        raise PathNotAllowed(f"path {str(path)!r} is not a valid path")
    given = raw if raw.is_absolute() else Path(roots[0]) / raw
    lexical = Path(os.path.normpath(os.path.abspath(given)))
    lexical_roots = [Path(os.path.normpath(os.path.abspath(r))) for r in roots]
    if not any(lexical.is_relative_to(r) for r in (*lexical_roots, *root_paths)):
        how = "is outside" if raw.is_absolute() else "climbs out of"
        raise PathNotAllowed(f"path '{path}' {how} the allowed roots ({_roots_text(root_paths)})")
    resolved = lexical.resolve()
    if not any(resolved.is_relative_to(r) for r in root_paths):
        raise PathNotAllowed(
            f"path '{path}' leads outside the allowed roots ({_roots_text(root_paths)}) through a symlink: "
            f"it resolves to {resolved}"
        )
    return resolved


# -- executables ----------------------------------------------------------------------------------------------------
_RUNS_CODE = "makes the program load or run other code"
_SHELL = "makes shells run other commands"
_CONFIG = "makes programs read their configuration (and the commands it names) from elsewhere"
_NAMES_PROGRAM = "names a program that programs run"
EXEC_ENV_RULES: Mapping[str, str] = {
    "PATH": "changes which program a name runs",
    "LD_*": _RUNS_CODE, "DYLD_*": _RUNS_CODE, "GCONV_PATH": _RUNS_CODE,
    "GIT_*": "makes git run other commands (config, ssh, editor, exec path) or use another repository",
    "PYTHON*": _RUNS_CODE, "PERL5*": _RUNS_CODE, "PERLLIB": _RUNS_CODE, "RUBY*": _RUNS_CODE,
    "NODE_OPTIONS": _RUNS_CODE, "NODE_PATH": _RUNS_CODE, "NPM_CONFIG_*": _RUNS_CODE, "CLASSPATH": _RUNS_CODE,
    "JAVA_TOOL_OPTIONS": _RUNS_CODE, "_JAVA_OPTIONS": _RUNS_CODE, "JDK_JAVA_OPTIONS": _RUNS_CODE,
    "BASH_ENV": _SHELL, "ENV": _SHELL, "ZDOTDIR": _SHELL, "SHELLOPTS": _SHELL, "BASHOPTS": _SHELL, "PS4": _SHELL,
    "PROMPT_COMMAND": _SHELL, "BASH_FUNC_*": _SHELL, "IFS": "changes how shells split a command into words",
    "HOME": _CONFIG, "XDG_CONFIG_HOME": _CONFIG, "XDG_CONFIG_DIRS": _CONFIG,
    "SHELL": _NAMES_PROGRAM, "EDITOR": _NAMES_PROGRAM, "VISUAL": _NAMES_PROGRAM, "PAGER": _NAMES_PROGRAM,
    "MANPAGER": _NAMES_PROGRAM, "BROWSER": _NAMES_PROGRAM, "SSH_ASKPASS": _NAMES_PROGRAM,
    "SUDO_ASKPASS": _NAMES_PROGRAM, "LESSOPEN": _NAMES_PROGRAM, "LESSCLOSE": _NAMES_PROGRAM,
}
"""``env`` keys a shell step may not set when an allowlist is in force (patterns, matched case-insensitively), each
with why: they change what a program executes. ``allow_env`` (a run configuration's ``allow_env = ["NAME"]``) lifts
the rule for a name."""


@dataclass(frozen=True)
class OptionRule:
    """Options of one program that make it run other programs or leave the working directory (refused)."""

    program: str  # the file name of the resolved program
    global_options: tuple[str, ...]  # refused before the subcommand
    anywhere: tuple[str, ...]  # refused after it
    by_subcommand: Mapping[str, tuple[str, ...]]  # further short options refused after these subcommands

    def problem(self, argv: Sequence[Any]) -> tuple[int, str] | None:
        """The index and text of the first refused option in ``argv`` (non-strings, references skipped)."""
        subcommand: str | None = None
        for index, arg in enumerate(argv[1:], start=1):
            if not isinstance(arg, str) or "${" in arg:
                continue
            if arg == "--":
                return None
            if not arg.startswith("-"):
                subcommand = subcommand or arg
                continue
            refused = self.global_options if subcommand is None else \
                (*self.anywhere, *self.by_subcommand.get(subcommand, ()))
            if any(_is_option(arg, opt, clusters=subcommand is not None) for opt in refused):
                return index, (f"option '{arg}' is refused for {self.program}: it runs other programs or leaves "
                               "the working directory (rule: program options)")
        return None


def _is_option(arg: str, option: str, *, clusters: bool) -> bool:
    """Whether ``arg`` is ``option``: ``--opt``/``--opt=v``, or ``-o``/``-ov`` (and ``-xo`` in a cluster)."""
    if option.startswith("--"):
        return arg == option or arg.startswith(option + "=")
    if arg.startswith("--"):
        return False
    return arg.startswith(option) or (clusters and option[1] in arg[1:])


OPTION_RULES: Mapping[str, OptionRule] = {
    "git": OptionRule(
        "git",
        global_options=("-c", "--config-env", "--exec-path", "-C", "--git-dir", "--work-tree"),
        anywhere=("--upload-pack", "--receive-pack", "--exec", "--config", "--template"),
        by_subcommand={name: ("-c", "-u") for name in ("clone", "fetch", "pull", "ls-remote", "archive",
                                                        "submodule")},
    ),
}
"""Per-program option rules. A speed bump, not a boundary: an allowed git still runs the hooks and the aliases of
a repository a step can write (see docs/tools.md)."""


def _absolute_dirs(search_path: str) -> str:
    """``search_path`` without relative entries (``.``, empty): a bare name never means a file in some cwd."""
    return os.pathsep.join(d for d in search_path.split(os.pathsep) if os.path.isabs(d))


def _locate(program: str, cwd: str | os.PathLike[str] | None, search_path: str) -> str | None:
    """The absolute path ``program`` names: a bare name looked up on ``search_path``, a relative path taken from
    ``cwd`` (default: planweave's cwd). Normalised lexically: a symlink under another name is another program."""
    if "/" not in program:
        found = shutil.which(program, path=search_path)
        return os.path.normpath(os.path.abspath(found)) if found is not None else None
    return os.path.normpath(os.path.abspath(os.path.join(os.fspath(cwd) if cwd is not None else ".", program)))


def _in_step(message: str) -> str:
    """``message`` prefixed with the step calling the tool, if any."""
    try:
        return f"step '{current_step().step_id}': {message}"
    except LookupError:
        return message


@dataclass(frozen=True)
class ExecPolicy:
    """What a confined shell step may execute: programs resolved once to absolute paths, and ``env`` keys.

    Built once (:meth:`build`) with the engine's own ``PATH``; a step's ``env`` never changes what a name means.
    """

    entries: tuple[str, ...]  # the allowlist as given, for messages
    allowed: frozenset[str]  # the absolute paths the entries name
    search_path: str
    allow_env: frozenset[str] = frozenset()

    @classmethod
    def build(cls, allowlist: Iterable[str], allow_env: Iterable[str] = (), search_path: str | None = None,
              ) -> ExecPolicy:
        """Resolve ``allowlist`` (bare names on ``search_path``, default this process's ``PATH``; paths from the
        current directory) and keep ``allow_env``, names or patterns of ``env`` keys lifted from the rules."""
        path = _absolute_dirs(os.environ.get("PATH", os.defpath) if search_path is None else search_path)
        entries = tuple(sorted(set(allowlist)))
        allowed = frozenset(found for e in entries if (found := _locate(e, None, path)) is not None)
        return cls(entries, allowed, path, frozenset(allow_env))

    def resolve(self, program: str, cwd: str | os.PathLike[str] | None = None) -> str:
        """The absolute path to execute for ``program`` (relative paths from ``cwd``), if it is allowed; raise
        :class:`ExecutableNotAllowed` otherwise."""
        found = _locate(program, cwd, self.search_path) if program and "\x00" not in program else None
        if found is not None and found in self.allowed:
            return found
        listed = ", ".join(self.entries) or "empty"
        if found is None and program in self.entries:
            raise ExecutableNotAllowed(_in_step(
                f"program '{program}' is on the allowlist but not on planweave's PATH ({self.search_path})"))
        where = f" (resolved to {found})" if found is not None and "/" in program and found != program else ""
        raise ExecutableNotAllowed(_in_step(
            f"program '{program}'{where} is not on this run's executable allowlist ({listed})"))

    def option_problem(self, executable: str, argv: Sequence[Any]) -> tuple[str, str] | None:
        """The argv index and text of an option the program's rule refuses (see :data:`OPTION_RULES`)."""
        rule = OPTION_RULES.get(os.path.basename(executable))
        found = rule.problem(argv) if rule is not None else None
        return (f"argv[{found[0]}]", found[1]) if found is not None else None

    def env_problems(self, env: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A problem for every ``env`` key that is not a variable name or changes what a program executes."""
        problems = []
        for key in env:
            if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
                problems.append((f"env.{key}", f"env key {key!r} is not an environment variable name"))
                continue
            upper = key.upper()
            if any(fnmatch.fnmatchcase(upper, name.upper()) for name in self.allow_env):
                continue
            for pattern, reason in EXEC_ENV_RULES.items():
                if fnmatch.fnmatchcase(upper, pattern):
                    problems.append((f"env.{key}", f"env key '{key}' refused: it {reason} (rule {pattern}; "
                                                   f"allow it with allow_env = [\"{key}\"] in a --config)"))
                    break
        return problems

    def check_call(self, argv: Sequence[str], env: Mapping[str, str] | None,
                   cwd: str | os.PathLike[str] | None) -> str:
        """Everything at call time: return the absolute path to execute, or raise :class:`SafetyError`."""
        if not argv:
            raise ExecutableNotAllowed(_in_step("argv is empty: name a program"))
        executable = self.resolve(argv[0], cwd)
        problem = self.option_problem(executable, argv) or next(iter(self.env_problems(env or {})), None)
        if problem is not None:
            raise SafetyError(_in_step(f"{problem[0]}: {problem[1]}"))
        return executable


def check_argv(argv: Sequence[str], allowlist: Collection[str], cwd: str | os.PathLike[str] | None = None,
               ) -> list[str]:
    """Return ``argv`` as a list if its program is on ``allowlist`` and no option rule refuses it; raise
    :class:`SafetyError` (:class:`ExecutableNotAllowed` for the program) otherwise.

    An allowlist entry is a bare name (``git``: the file this process's ``PATH`` finds) or a path (exactly that
    file). The program is resolved the same way, a relative path from ``cwd``, and compared without following
    symlinks: ``./git``, ``/tmp/x/git`` or a link named ``ls`` never match the entry ``git`` or ``sh``.
    """
    ExecPolicy.build(allowlist).check_call(argv, None, cwd)
    return list(argv)


def _literal(value: Any) -> bool:
    return isinstance(value, str) and "${" not in value


@dataclass(frozen=True)
class _ConfinedShell(Tool):
    """The ``shell`` tool confined to a working directory and, optionally, to an allowlist of programs."""

    policy: ExecPolicy | None = None
    workdir: Path | None = None

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        """Validate like ``shell``; refuse, when literal: a program off the allowlist, a refused option or env key,
        a cwd outside the jail."""
        problems = super().check_args(args, deferred)
        cwd = args.get("cwd")
        base: str | Path | None = self.workdir
        if self.workdir is not None and "cwd" not in deferred and isinstance(cwd, str):
            try:
                base = confine_path(cwd, [self.workdir])
            except PathNotAllowed as exc:
                problems.append(("cwd", str(exc)))
                return problems
        elif isinstance(cwd, str):
            base = None if "cwd" in deferred else cwd
        if self.policy is not None:
            problems += self._policy_problems(args, deferred, base)
        return problems

    def _policy_problems(self, args: Mapping[str, Any], deferred: frozenset[str], base: str | Path | None,
                         ) -> list[tuple[str, str]]:
        assert self.policy is not None
        problems: list[tuple[str, str]] = []
        env = args.get("env")
        if isinstance(env, Mapping):  # keys are never references, so they are checked even if a value is one
            problems += self.policy.env_problems(env)
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv or not _literal(argv[0]):
            return problems
        program = argv[0]
        if base is None and "/" in program and not os.path.isabs(program):
            return problems  # relative to a cwd known at call time only
        try:
            executable = self.policy.resolve(program, base)
        except ExecutableNotAllowed as exc:
            return [("argv[0]", str(exc)), *problems]
        option = self.policy.option_problem(executable, argv)
        return [option, *problems] if option is not None else problems

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        """Confine the cwd, resolve the program once, check it, its options and ``env``; run exactly that file."""
        kwargs = self.bind(args)
        if self.workdir is not None:
            kwargs["cwd"] = str(confine_path(kwargs.get("cwd") or ".", [self.workdir]))
        if self.policy is None:
            return await self.fn(**kwargs)
        executable = self.policy.check_call(kwargs.get("argv") or [], kwargs.get("env"), kwargs.get("cwd"))
        return await run_program(kwargs.pop("argv"), executable=executable, **kwargs)


def confined_shell(*, allowlist: Iterable[str] | None = None, workdir: str | os.PathLike[str] | None = None,
                   allow_env: Iterable[str] = ()) -> Tool:
    """A ``shell`` tool that runs only the programs on ``allowlist`` (see :func:`check_argv`; None: any program),
    with its working directory confined to ``workdir`` (the default cwd; None: unconfined).

    With an allowlist, ``env`` keys that change what a program executes (:data:`EXEC_ENV_RULES`) are refused
    unless named in ``allow_env``, and so are the options of :data:`OPTION_RULES`.
    """
    base = Tool.from_function(shell, name="shell")
    policy = ExecPolicy.build(allowlist, allow_env) if allowlist is not None else None
    doc = base.description
    if policy is not None:
        doc += f"\n\nOnly these programs may run: {', '.join(policy.entries) or 'none'}."
    jail = Path(workdir).resolve() if workdir is not None else None
    if jail is not None:
        doc += f"\n\nIt runs in {jail} (cwd must stay inside it)."
    return _ConfinedShell(
        name=base.name, fn=base.fn, description=doc, idempotent=False, args_model=base.args_model,
        accepts_extra=base.accepts_extra, input_schema=base.input_schema, is_async=True, policy=policy,
        workdir=jail,
    )


def allowlisted_shell(allowlist: Iterable[str], allow_env: Iterable[str] = ()) -> Tool:
    """A ``shell`` tool that only runs the programs on ``allowlist`` (see :func:`check_argv`)."""
    return confined_shell(allowlist=allowlist, allow_env=allow_env)


# -- secrets --------------------------------------------------------------------------------------------------------
def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of secret-looking variables in ``environ`` (default ``os.environ``), of 6 characters or more."""
    env = os.environ if environ is None else environ
    return sorted(
        {v for k, v in env.items() if (SECRET_NAME.search(k) or k.upper() in SECRET_NAMES)
         and len(v) >= MIN_SECRET_LENGTH},
        key=lambda v: (-len(v), v),
    )


@functools.lru_cache(maxsize=16)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    usable = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=lambda v: (-len(v), v))
    if not usable:
        return None
    return re.compile("|".join(re.escape(s) for s in usable))  # longest first: a secret containing another


def redact(value: Any, secrets: Iterable[str] | Mapping[str, str] | None = None) -> Any:
    """Return ``value`` with every secret replaced by ``***``: strings, and the strings inside dicts/lists/tuples.

    ``secrets`` is a list of values, a mapping whose values are secrets (an environment: only secret-looking names
    count, see :func:`secret_values`), or None for the secrets in ``os.environ``. Values shorter than 6 characters
    are never redacted. Other types are returned unchanged.
    """
    if secrets is None or isinstance(secrets, Mapping):
        found = secret_values(secrets)
    else:
        found = [s for s in secrets if isinstance(s, str)]
    pattern = _pattern(tuple(found))
    if pattern is None:
        return value
    return _redact(value, pattern)


def _redact(value: Any, pattern: re.Pattern[str], by: str | Callable[[re.Match[str]], str] = REDACTED) -> Any:
    if isinstance(value, str):
        return pattern.sub(by, value)
    if isinstance(value, Mapping):
        return {(_redact(k, pattern, by) if isinstance(k, str) else k): _redact(v, pattern, by)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, pattern, by) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v, pattern, by) for v in value)
    return value


PLACEHOLDER = re.compile(r"\*\*\*\$([A-Za-z_][A-Za-z0-9_]*)#([0-9a-f]{16})\*\*\*")
"""How a secret literal is kept in a journaled plan: ``***$NAME#NONCE***``, NAME the environment variable holding
it, NONCE the random one of the event that sealed it (recorded in the event's ``seal``)."""
SEAL_KEY = "seal"
"""The key of a sealed event's data holding its nonce: only placeholders with that nonce are unsealed."""


class SecretRedactor:
    """Hides the values of this process's secret environment variables (see :func:`secret_values`).

    Called like :func:`redact`, it turns them into ``***`` (outputs, errors). :meth:`seal` turns them into
    ``***$NAME#NONCE***`` in the plans of ``run_created``, ``plan_version`` and ``steps_added`` before they are
    journaled (the running plan keeps the value); :meth:`unseal` puts the values of the resuming process's
    environment back when a run is resumed, so a resumed step gets what the live one got.

    Only what was sealed is unsealed: each sealed event draws a random nonce, puts it in its placeholders and
    records it under ``seal``. A placeholder written into a plan by its author or a model (``***$AWS_SECRET***``,
    or one with a guessed nonce) stays the literal text it is, so a plan cannot ask a resume for a secret by name.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        names: dict[str, str] = {}
        for name in sorted(env):
            value = env[name]
            if (SECRET_NAME.search(name) or name.upper() in SECRET_NAMES) and len(value) >= MIN_SECRET_LENGTH:
                names.setdefault(value, name)
        self._names = names  # secret value -> the (first) variable holding it
        self._values = tuple(sorted(names, key=lambda v: (-len(v), v)))
        self._environ = {name: value for value, name in names.items()}

    def __bool__(self) -> bool:
        return bool(self._names)

    def hide(self, secrets: Mapping[str, str]) -> None:
        """Also hide ``secrets`` (name → value, whatever the name: a model endpoint's key, its headers' values)
        from now on; hiding more is always safe, so a redactor shared by runs hides every run's."""
        for name, value in secrets.items():
            if len(value) >= MIN_SECRET_LENGTH:
                self._names.setdefault(value, name)
        self._values = tuple(sorted(self._names, key=lambda v: (-len(v), v)))
        self._environ = {name: value for value, name in self._names.items()}

    def __call__(self, value: Any) -> Any:
        """``value`` with every secret replaced by ``***`` (see :func:`redact`)."""
        return redact(value, self._values) if self._values else value

    def seal(self, event: Event) -> Event:
        """``event`` with the secrets in its plan (or steps) replaced by placeholders carrying a fresh nonce, which
        the event's data records under ``seal``; the same event if it holds no secret."""
        key = "steps" if event.kind == "steps_added" else "plan"
        pattern = _pattern(self._values)
        raw = event.data.get(key)
        if pattern is None or raw is None:
            return event
        found = _pattern(tuple(json.dumps(v, ensure_ascii=False)[1:-1] for v in self._values))  # as JSON has it
        if found is None or not found.search(_text(raw)):  # the common case, kept cheap (~30 ms for 10,000 steps)
            return event
        nonce = token_hex(8)
        sealed = _redact(_document(raw), pattern, lambda m: f"***${self._names[m.group(0)]}#{nonce}***")
        return event._replace(data={**event.data, key: sealed, SEAL_KEY: nonce})

    def unseal(self, events: Sequence[Event]) -> list[Event]:
        """``events`` with the placeholders they sealed replaced by this environment's values (any other
        placeholder text stays as it is); raises :class:`RunError` naming the variable when one is not set here."""
        return [self._unseal(e) if e.kind in ("run_created", "plan_version", "steps_added") else e for e in events]

    def _unseal(self, event: Event) -> Event:
        key = "steps" if event.kind == "steps_added" else "plan"
        raw = event.data.get(key)
        nonce = event.data.get(SEAL_KEY)
        if raw is None or not isinstance(nonce, str):
            return event
        names = sorted({name for name, n in PLACEHOLDER.findall(_text(raw)) if n == nonce})
        for name in names:
            if name not in self._environ:
                raise RunError(
                    f"run '{event.run_id}': its plan held the value of ${name}, which the journal keeps "
                    f"sealed: set {name} in this environment to resume it")
        ours = re.compile(r"\*\*\*\$([A-Za-z_][A-Za-z0-9_]*)#" + re.escape(nonce) + r"\*\*\*")
        restored = _redact(_document(raw), ours, lambda m: self._environ[m.group(1)])
        data = {k: v for k, v in event.data.items() if k != SEAL_KEY}
        return event._replace(data={**data, key: restored})


def _text(value: Any) -> str:
    """``value`` (a plan, steps or a document) as JSON text, to search for secrets (as JSON escapes them)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json(by_alias=True, exclude_defaults=True)
    if isinstance(value, (list, tuple)):
        return "".join(_text(v) for v in value)
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _document(value: Any) -> Any:
    """A plan, a list of steps or a document, as the JSON document the journal stores."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if isinstance(value, (list, tuple)):
        return [_document(v) for v in value]
    return value


# -- file tools -----------------------------------------------------------------------------------------------------
def file_tools(  # noqa: C901 (three tools defined inside, each simple)
    roots: Sequence[str | os.PathLike[str]],
    *,
    read_limit: int = READ_LIMIT,
    write_limit: int = WRITE_LIMIT,
    list_limit: int = LIST_LIMIT,
) -> Toolbox:
    """A toolbox with ``file.read``, ``file.write`` and ``file.list``, confined to ``roots`` (see :func:`confine_path`).

    Relative paths are taken from the first root. ``file.read`` returns at most ``read_limit`` bytes (and says when it
    cut), ``file.write`` refuses more than ``write_limit`` characters, ``file.list`` returns at most ``list_limit``
    entries.
    """
    root_list = [Path(r) for r in roots]
    if not root_list:
        raise ValueError("file_tools needs at least one root directory")
    for root in root_list:
        if not root.is_dir():
            raise ValueError(f"file tool root '{root}' is not a directory")

    def read(path: str, encoding: str = "utf-8") -> dict[str, Any]:
        """Read a text file under the allowed roots; returns path, text, size (bytes) and truncated."""
        target = confine_path(path, root_list)
        try:
            size = target.stat().st_size
            with open(target, "rb") as fh:
                data = fh.read(read_limit)
        except FileNotFoundError:
            raise ToolError(f"file.read: no file '{path}'", kind="not_found", retryable=False) from None
        except IsADirectoryError:
            raise ToolError(f"file.read: '{path}' is a directory (use file.list)", kind="arguments",
                            retryable=False) from None
        except OSError as exc:
            raise ToolError(f"file.read: cannot read '{path}': {exc.strerror or exc}", kind="io") from None
        truncated = size > len(data)
        try:
            text = data.decode(encoding, errors="strict" if not truncated else "ignore")
        except (UnicodeDecodeError, LookupError) as exc:
            raise ToolError(f"file.read: '{path}' is not {encoding} text: {exc}", kind="arguments",
                            retryable=False) from None
        if truncated:
            text += f"\n[... {size - len(data)} more bytes cut at file.read's limit of {read_limit} bytes]"
        return {"path": str(target), "text": text, "size": size, "truncated": truncated}

    def write(path: str, text: str, append: bool = False, make_dirs: bool = True) -> dict[str, Any]:
        """Write (or with ``append``, add to) a text file under the allowed roots; returns path and bytes written."""
        if len(text) > write_limit:
            raise ToolError(f"file.write: {len(text)} characters for '{path}' exceed the limit of {write_limit}",
                            kind="arguments", retryable=False)
        target = confine_path(path, root_list)
        data = text.encode()
        try:
            if make_dirs:
                target.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(target, flags, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except IsADirectoryError:
            raise ToolError(f"file.write: '{path}' is a directory", kind="arguments", retryable=False) from None
        except OSError as exc:
            raise ToolError(f"file.write: cannot write '{path}': {exc.strerror or exc}", kind="io") from None
        return {"path": str(target), "bytes": len(data)}

    def list_(path: str = ".", pattern: str = "*", recursive: bool = False) -> dict[str, Any]:
        """List a directory under the allowed roots; entries have name (relative), type and size; sorted by name."""
        base = confine_path(path, root_list)
        if not base.is_dir():
            raise ToolError(f"file.list: '{path}' is not a directory", kind="not_found", retryable=False)
        entries: list[dict[str, Any]] = []
        truncated = False

        def visit(directory: Path) -> bool:
            """Add the entries of ``directory`` (and below, if recursive) by name; False once the limit is hit."""
            nonlocal truncated
            for entry in sorted(directory.iterdir()):
                kind = "symlink" if entry.is_symlink() else "dir" if entry.is_dir() else "file"
                if fnmatch.fnmatch(entry.name, pattern):
                    if len(entries) >= list_limit:
                        truncated = True
                        return False
                    size = entry.lstat().st_size if kind == "file" else None
                    entries.append({"name": entry.relative_to(base).as_posix(), "type": kind, "size": size})
                if recursive and kind == "dir" and not visit(entry):  # symlinked directories are not entered
                    return False
            return True

        try:
            visit(base)
        except OSError as exc:
            raise ToolError(f"file.list: cannot list '{path}': {exc.strerror or exc}", kind="io") from None
        return {"path": str(base), "entries": entries, "truncated": truncated}

    box = Toolbox()
    box.add(read, name="file.read", idempotent=True)
    box.add(write, name="file.write")
    box.add(list_, name="file.list", idempotent=True)
    return box


def hide_secrets(redact: object, secrets: Mapping[str, str]) -> None:
    """Make ``redact`` (an engine's, when it is a :class:`SecretRedactor`) hide ``secrets`` too."""
    if isinstance(redact, SecretRedactor):
        redact.hide(secrets)
