"""Guards for tools that touch the machine: path confinement, an executable allowlist and secret redaction.

Also the ``file.read`` / ``file.write`` / ``file.list`` tools, which only reach files under declared roots, and
``allowlisted_shell``, the ``shell`` tool limited to named executables. These are guards against a plan (often
written by a model) wandering off, not a sandbox: a tool with an allowed interpreter can still do anything the
interpreter can.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import shutil
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planweave.errors import ToolError
from planweave.tools.builtins import shell
from planweave.tools.registry import Tool, Toolbox

__all__ = [
    "ExecutableNotAllowed",
    "PathNotAllowed",
    "SafetyError",
    "allowlisted_shell",
    "check_argv",
    "confine_path",
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
def check_argv(argv: Sequence[str], allowlist: Collection[str]) -> list[str]:
    """Return ``argv`` as a list if its program is on ``allowlist``; raise :class:`ExecutableNotAllowed` otherwise.

    An allowlist entry is a bare name (``git``: allows ``git``, and the absolute path ``which git`` finds) or an
    absolute path (allows exactly that file). A path such as ``./git`` or ``/tmp/x/git`` never matches the bare
    name ``git``: the name says which program, not which file name.
    """
    if not argv:
        raise ExecutableNotAllowed("argv is empty: name a program")
    program = argv[0]
    allowed = sorted(allowlist)
    if "/" not in program:
        if program in allowlist:
            return list(argv)
    else:
        target = os.path.realpath(program)
        for entry in allowlist:
            candidate = entry if "/" in entry else shutil.which(entry)
            if candidate is not None and os.path.isabs(candidate) and os.path.realpath(candidate) == target:
                return list(argv)
    raise ExecutableNotAllowed(
        f"program '{program}' is not on this run's executable allowlist ({', '.join(allowed) or 'empty'})"
    )


@dataclass(frozen=True)
class _ConfinedShell(Tool):
    """The ``shell`` tool confined to a working directory and, optionally, to an allowlist of programs."""

    allowlist: frozenset[str] | None = None
    workdir: Path | None = None

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        """Validate like ``shell``; refuse a literal program off the allowlist or a literal cwd outside the jail."""
        problems = super().check_args(args, deferred)
        argv = args.get("argv")
        if self.allowlist is not None and "argv" not in deferred and isinstance(argv, list) and argv \
                and isinstance(argv[0], str) and "${" not in argv[0]:
            try:
                check_argv(argv, self.allowlist)
            except ExecutableNotAllowed as exc:
                problems.append(("argv[0]", str(exc)))
        cwd = args.get("cwd")
        if self.workdir is not None and "cwd" not in deferred and isinstance(cwd, str):
            try:
                confine_path(cwd, [self.workdir])
            except PathNotAllowed as exc:
                problems.append(("cwd", str(exc)))
        return problems

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        """Refuse a program off the allowlist or a cwd outside the working directory, then run it like ``shell``."""
        kwargs = self.bind(args)
        if self.allowlist is not None:
            check_argv(kwargs.get("argv") or [], self.allowlist)
        if self.workdir is not None:
            kwargs["cwd"] = str(confine_path(kwargs.get("cwd") or ".", [self.workdir]))
        return await self.fn(**kwargs)


def confined_shell(*, allowlist: Iterable[str] | None = None, workdir: str | os.PathLike[str] | None = None) -> Tool:
    """A ``shell`` tool that runs only the programs on ``allowlist`` (see :func:`check_argv`; None: any program),
    with its working directory confined to ``workdir`` (the default cwd; None: unconfined)."""
    base = Tool.from_function(shell, name="shell")
    names = frozenset(allowlist) if allowlist is not None else None
    doc = base.description
    if names is not None:
        doc += f"\n\nOnly these programs may run: {', '.join(sorted(names)) or 'none'}."
    jail = Path(workdir).resolve() if workdir is not None else None
    if jail is not None:
        doc += f"\n\nIt runs in {jail} (cwd must stay inside it)."
    return _ConfinedShell(
        name=base.name, fn=base.fn, description=doc, idempotent=False, args_model=base.args_model,
        accepts_extra=base.accepts_extra, input_schema=base.input_schema, is_async=True, allowlist=names,
        workdir=jail,
    )


def allowlisted_shell(allowlist: Iterable[str]) -> Tool:
    """A ``shell`` tool that only runs the programs on ``allowlist`` (see :func:`check_argv`)."""
    return confined_shell(allowlist=allowlist)


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


def _redact(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, Mapping):
        return {(_redact(k, pattern) if isinstance(k, str) else k): _redact(v, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, pattern) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v, pattern) for v in value)
    return value


# -- file tools -----------------------------------------------------------------------------------------------------
def file_tools(
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
