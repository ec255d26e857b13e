"""Where a model is called: :class:`Endpoint` (base URL, the key or the environment variable holding it, extra
headers), given per run and per tier instead of through the process-wide ``OPENAI_BASE_URL``/``OPENAI_API_KEY``.

A key is never journaled, printed or shown: :meth:`Endpoint.journaled` keeps the base URL (none that carries a
credential), the *name* of the variable the key came from, and the names of the extra headers (their values may be
credentials too: they are given again on resume, like a literal key). :func:`RoutedClient` sends each request to
the client of its model, so the tiers of one table may sit on different endpoints. docs/models.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from planweave.core.errors import PlanweaveError
from planweave.models.base import Chunk, Completion, CompletionRequest, ModelClient

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
MAX_HEADERS = 32
#: Headers an endpoint may not set: the client's own (the key goes in Authorization, from ``api_key``/``api_key_env``).
RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "transfer-encoding"})
ENDPOINT_FIELDS = ("base_url", "api_key_env", "api_key", "headers")


class EndpointError(PlanweaveError, ValueError):
    """An endpoint is given wrong, or its key variable is unset; ``field`` names the field (``base_url``,
    ``api_key_env``, ``headers``, ...). The CLI prints it and exits 2."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible endpoint for one run or one tier; every part optional (None: the process's default).

    ``api_key`` (a literal key, Python callers only) and ``api_key_env`` (the name of the variable holding it, read
    when a client opens) are exclusive. ``headers`` are sent with every request. ``repr`` never shows the key or the
    headers' values.
    """

    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in ("http", "https") or not parts.netloc or len(self.base_url) > 2000:
                raise EndpointError(f"base_url must be an http(s) URL, got {self.base_url[:200]!r}", field="base_url")
        if self.api_key_env is not None and not ENV_NAME.fullmatch(self.api_key_env):
            raise EndpointError(f"api_key_env must name an environment variable, got {self.api_key_env[:200]!r}",
                                field="api_key_env")
        if self.api_key is not None and self.api_key_env is not None:
            raise EndpointError("give api_key or api_key_env, not both", field="api_key")
        if len(self.headers) > MAX_HEADERS:
            raise EndpointError(f"{len(self.headers)} headers, more than {MAX_HEADERS}", field="headers")
        for name, value in self.headers:
            if not HEADER_NAME.fullmatch(name):
                raise EndpointError(f"header name {name[:200]!r} is not a valid HTTP header name", field="headers")
            if name.lower() in RESERVED_HEADERS:
                raise EndpointError(f"header '{name}' is set by the client (the key: api_key_env)", field="headers")
            if any(c in value for c in "\r\n\0") or len(value) > 8000:
                raise EndpointError(f"header '{name}': its value must be one line of at most 8000 characters",
                                    field="headers")

    @property
    def default(self) -> bool:
        """Nothing given: the process's defaults apply."""
        return self == Endpoint()

    def key(self) -> str | None:
        """The key to send: ``api_key``, else the value of ``api_key_env`` (an :class:`EndpointError` naming the
        variable when it is unset), else None (the client's default, ``OPENAI_API_KEY``)."""
        if self.api_key is not None:
            return self.api_key
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise EndpointError(f"the environment variable {self.api_key_env} (api_key_env) is not set",
                                field="api_key_env")
        return value

    def secrets(self) -> dict[str, str]:
        """The values that must never be shown, by a name to show instead: the key (under the name of its variable)
        and the headers' values (``HEADER_<NAME>``); what a run's redactor hides
        (:meth:`planweave.tools.safety.SecretRedactor.hide`)."""
        found: dict[str, str] = {}
        key = self.api_key if self.api_key is not None else (
            os.environ.get(self.api_key_env) if self.api_key_env else None)
        if key:
            found[self.api_key_env or "API_KEY"] = key
        for name, value in self.headers:
            if value:
                found["HEADER_" + re.sub(r"[^A-Za-z0-9_]", "_", name).upper()] = value
        return found

    def client_options(self) -> dict[str, Any]:
        """The keyword options of :class:`~planweave.models.openai.OpenAIChatClient` for this endpoint."""
        options: dict[str, Any] = {}
        if self.base_url is not None:
            options["base_url"] = self.base_url
        key = self.key()
        if key is not None:
            options["api_key"] = key
        if self.headers:
            options["headers"] = dict(self.headers)
        return options

    def journaled(self) -> dict[str, Any]:
        """What a run journals of it (``options.limits.endpoint``, a tier's entry): the base URL unless it may carry
        a credential (a user, a password, a query), the key's variable name, the headers' names; never a value."""
        record: dict[str, Any] = {}
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if "@" not in parts.netloc and not parts.query:
                record["base_url"] = self.base_url
        if self.api_key_env is not None:
            record["api_key_env"] = self.api_key_env
        if self.headers:
            record["header_names"] = [name for name, _ in self.headers]
        return record

    def over(self, base: Endpoint) -> Endpoint:
        """This endpoint, its unset parts taken from ``base`` (a tier's over the run's; given flags over journaled)."""
        same_url = self.base_url is None or self.base_url == base.base_url
        keyed = self.api_key is not None or self.api_key_env is not None
        return Endpoint(
            self.base_url if self.base_url is not None else base.base_url,
            self.api_key_env if keyed else (base.api_key_env if same_url else None),
            self.api_key if keyed else (base.api_key if same_url else None),
            self.headers or (base.headers if same_url else ()),
        )

    @classmethod
    def from_mapping(cls, doc: Any, *, where: str = "endpoint", literal_key: bool = False) -> Endpoint:
        """Read ``{base_url?, api_key_env?, headers?: {name: value}}`` (a tier table's entry, ``POST /runs``
        ``endpoint``); ``api_key`` only with ``literal_key`` (never from a file or a request: it would be kept)."""
        if not isinstance(doc, Mapping):
            raise EndpointError(f"{where}: expected a mapping, got {type(doc).__name__}", field="")
        allowed = ENDPOINT_FIELDS if literal_key else tuple(f for f in ENDPOINT_FIELDS if f != "api_key")
        for name in doc:
            if name not in allowed:
                hint = (" (a key is given by the name of the variable holding it: api_key_env)"
                        if name == "api_key" else f" (fields: {', '.join(allowed)})")
                raise EndpointError(f"{where}: unknown field '{name}'{hint}", field=str(name))
        for name in ("base_url", "api_key_env", "api_key"):
            if doc.get(name) is not None and not isinstance(doc[name], str):
                raise EndpointError(f"{where}: field '{name}' must be a string", field=name)
        headers = doc.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise EndpointError(f"{where}: field 'headers' must map header names to string values", field="headers")
        try:
            return cls(doc.get("base_url"), doc.get("api_key_env"), doc.get("api_key"), tuple(headers.items()))
        except EndpointError as exc:
            raise EndpointError(f"{where}: {exc}", field=exc.field) from None

    @classmethod
    def from_journal(cls, record: Any) -> Endpoint:
        """The endpoint a run journaled (:meth:`journaled`): base URL and key variable; headers are not kept."""
        if not isinstance(record, Mapping):
            return cls()
        url, env = record.get("base_url"), record.get("api_key_env")
        try:
            return cls(url if isinstance(url, str) else None, env if isinstance(env, str) else None)
        except EndpointError:
            return cls()


def parse_headers(given: Sequence[str] | None, *, flag: str = "--header") -> tuple[tuple[str, str], ...]:
    """``--header 'Name: value'`` given any number of times → the header pairs; ValueError naming the flag."""
    pairs: list[tuple[str, str]] = []
    for text in given or ():
        name, sep, value = text.partition(":")
        if not sep or not name.strip():
            raise EndpointError(f"{flag} {text.split(':')[0][:80]!r}...: expected 'Name: value'", field="headers")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


class RoutedClient:
    """A :class:`ModelClient` that sends each request to the client of its model (``routes``), else to ``default``:
    the tiers of one table on different endpoints, behind the one client an ``llm`` tool or a planner holds."""

    def __init__(self, default: ModelClient, routes: Mapping[str, ModelClient]) -> None:
        self._default = default
        self._routes = dict(routes)

    @property
    def model(self) -> str:
        return self._default.model

    @property
    def prices(self) -> Any:
        """The default client's price table (what the budget checks read), if it has one."""
        return getattr(self._default, "prices", None)

    def client_for(self, model: str | None) -> ModelClient:
        return self._routes.get(model or self._default.model, self._default)

    async def complete(self, request: CompletionRequest) -> Completion:
        return await self.client_for(request.model).complete(request)

    def stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        return self.client_for(request.model).stream(request)
