"""Which model endpoints a client of the server may point a run at (``POST /runs`` ``endpoint``, a tier's
``base_url``): only the base URLs the server was started with (``--base-url``, each ``--allow-endpoint URL``), and
only the key variables it was given (``--api-key-env``, each ``--allow-key-env NAME``); else 422 naming the field.

Without such a list a client could make the server send requests, and the keys in its environment, anywhere.
docs/models.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from planweave.core.errors import PlanInvalid, PlanProblem
from planweave.models.endpoint import Endpoint, EndpointError
from planweave.server.runs import HTTP_SOURCE


@dataclass(frozen=True)
class EndpointPolicy:
    """The base URLs and key variables a request's endpoint may name (compared without a trailing ``/``)."""

    base_urls: frozenset[str] = frozenset()
    key_envs: frozenset[str] = frozenset()

    @classmethod
    def of(cls, own: Endpoint, allow_endpoints: Iterable[str] = (), allow_key_envs: Iterable[str] = ()
           ) -> EndpointPolicy:
        """The server's own endpoint and the ones ``--allow-endpoint``/``--allow-key-env`` add."""
        urls = {u.rstrip("/") for u in (*allow_endpoints, *((own.base_url,) if own.base_url else ()))}
        envs = {*allow_key_envs, *((own.api_key_env,) if own.api_key_env else ())}
        return cls(frozenset(urls), frozenset(envs))

    def check(self, endpoint: Endpoint, field: str) -> None:
        """Raise PlanInvalid (422) naming ``field`` and the flag that would allow it, when ``endpoint`` names a base
        URL or a key variable this server was not started with."""
        if endpoint.base_url is not None and endpoint.base_url.rstrip("/") not in self.base_urls:
            allowed = ", ".join(sorted(self.base_urls)) or "none"
            raise PlanInvalid([PlanProblem("", f"{field}.base_url", f"{endpoint.base_url[:200]!r} is not an endpoint "
                                           f"this server may call (allowed: {allowed}; planweave serve "
                                           "--allow-endpoint URL)")], HTTP_SOURCE)
        if endpoint.api_key_env is not None and endpoint.api_key_env not in self.key_envs:
            raise PlanInvalid([PlanProblem("", f"{field}.api_key_env", f"'{endpoint.api_key_env}' is not a key "
                                           "variable this server may send (planweave serve --allow-key-env "
                                           "NAME)")], HTTP_SOURCE)

    def read(self, doc: Mapping[str, Any] | None, field: str = "endpoint") -> Endpoint | None:
        """A request's ``endpoint`` checked (422 naming the field), or None without one."""
        if doc is None:
            return None
        try:
            endpoint = Endpoint.from_mapping(doc, where=field)
        except EndpointError as exc:
            raise PlanInvalid([PlanProblem("", f"{field}.{exc.field}" if exc.field else field, str(exc))],
                              HTTP_SOURCE) from None
        self.check(endpoint, field)
        return endpoint
