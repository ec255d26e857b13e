"""The server's access token: where it comes from, where it is kept, and how a request proves it knows it.

One token guards every endpoint but ``/healthz`` and the dashboard's static files. It comes from
``$PLANWEAVE_TOKEN`` when set; otherwise it is generated at the first start, stored in a file only its owner can
read (``0600``) and reused by later starts, so a browser that saved it stays logged in across restarts.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from planweave.core.errors import PlanweaveError

TOKEN_ENV = "PLANWEAVE_TOKEN"
TOKEN_FILE_ENV = "PLANWEAVE_TOKEN_FILE"
_MIN_LENGTH = 16

TokenOrigin = Literal["given", "env", "file", "generated"]


class TokenError(PlanweaveError):
    """The access token could not be read, created or stored, or is too weak to use."""


@dataclass(frozen=True)
class AccessToken:
    """A resolved token and where it came from (``generated`` means it was just created and must be shown)."""

    value: str = ""
    origin: TokenOrigin = "given"
    path: Path | None = None

    def __repr__(self) -> str:  # the value must never end up in a log line or a traceback
        return f"AccessToken(origin={self.origin!r}, path={self.path!r})"

    def matches(self, candidate: str) -> bool:
        """Whether ``candidate`` is this token, compared in constant time."""
        return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), self.value.encode("utf-8"))


def default_token_path(journal_url: str | None) -> Path:
    """Where a generated token is kept: ``$PLANWEAVE_TOKEN_FILE``, else beside a SQLite journal, else in the config dir.

    Beside the journal, each journal (each project) gets its own token; other journals share
    ``$XDG_CONFIG_HOME/planweave/token`` (``~/.config/planweave/token``).
    """
    explicit = os.environ.get(TOKEN_FILE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    if journal_url and journal_url.startswith("sqlite:"):
        from planweave.journal.sqlite import path_of

        path = path_of(journal_url)
        if path != ":memory:":
            return Path(path).expanduser().resolve().parent / "server-token"
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "planweave" / "token"


def _check(value: str, where: str) -> str:
    value = value.strip()
    if len(value) < _MIN_LENGTH:
        raise TokenError(f"the access token from {where} is too short: use at least {_MIN_LENGTH} characters")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise TokenError(f"the access token from {where} contains spaces or control characters")
    return value


def _read_token_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            # Someone loosened it: take it back rather than serve with a token others can read.
            path.chmod(0o600)
        return _check(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise TokenError(f"cannot read the access token file {path}: {exc.strerror or exc}") from None


def _write_token_file(path: Path, value: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # O_EXCL: two servers starting at once must not overwrite each other's token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise
    except OSError as exc:
        raise TokenError(f"cannot store the access token in {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")


def resolve_token(token: str | None = None, journal_url: str | None = None) -> AccessToken:
    """The token the server accepts: ``token`` if given, else ``$PLANWEAVE_TOKEN``, else the stored or a new one.

    A new token is ``secrets.token_urlsafe(32)`` written to :func:`default_token_path` with mode ``0600``; its
    origin is ``generated`` so that the caller shows it once. Raises :class:`TokenError`.
    """
    if token is not None:
        return AccessToken(_check(token, "the token argument"), "given")
    from_env = os.environ.get(TOKEN_ENV)
    if from_env:
        return AccessToken(_check(from_env, f"${TOKEN_ENV}"), "env")
    path = default_token_path(journal_url)
    if path.exists():
        return AccessToken(_read_token_file(path), "file", path)
    value = secrets.token_urlsafe(32)
    try:
        _write_token_file(path, value)
    except FileExistsError:  # another process created it meanwhile: use theirs
        return AccessToken(_read_token_file(path), "file", path)
    return AccessToken(value, "generated", path)
