"""Errors of the model layer: provider failures translated at the client boundary, and budget refusals.

Every message names the model and the base URL it was called at (never the API key), so a failed step says which
endpoint to look at.
"""

from __future__ import annotations

from planweave.core.errors import PlanweaveError


class ModelError(PlanweaveError):
    """A model call failed; ``model`` and ``base_url`` say where, ``retryable`` whether trying again may help."""

    retryable: bool = True

    def __init__(self, message: str, *, model: str, base_url: str) -> None:
        super().__init__(f"model '{model}' at {base_url}: {message}")
        self.model = model
        self.base_url = base_url


class RateLimited(ModelError):
    """The provider answered HTTP 429; ``retry_after`` is the wait it asked for in seconds (None if it gave none)."""

    def __init__(self, message: str, *, model: str, base_url: str, retry_after: float | None) -> None:
        super().__init__(message, model=model, base_url=base_url)
        self.retry_after = retry_after


class ProviderError(ModelError):
    """The provider answered an HTTP error (or a reply that is not the Chat Completions format).

    ``status`` is the HTTP status and ``body`` an excerpt of the response body. Server errors (5xx), 408 and 409 are
    retryable; other client errors are not: the same request would fail again.
    """

    def __init__(self, message: str, *, model: str, base_url: str, status: int, body: str) -> None:
        super().__init__(message, model=model, base_url=base_url)
        self.status = status
        self.body = body
        self.retryable = status >= 500 or status in (408, 409)


class ModelTimeout(ModelError):
    """The provider did not answer in time: no connection, no response, or a stream that stalled."""


class ModelUnavailable(ModelError):
    """The provider could not be reached (connection refused, name not resolved) or dropped the connection."""


class MalformedOutput(ModelError):
    """The model's reply is not the JSON the request's schema asked for; ``text`` is the reply (it may be long)."""

    def __init__(self, message: str, *, model: str, base_url: str, text: str) -> None:
        super().__init__(message, model=model, base_url=base_url)
        self.text = text


class CallRefused(ModelError):
    """The call can never be admitted at its endpoint (it needs more tokens than the endpoint's tokens per minute)."""

    retryable = False


class LocalModelUnavailable(ModelError):
    """The local model cannot be started: llama-cpp-python or the model package is missing, or the server failed."""

    retryable = False


class BudgetExceeded(PlanweaveError):
    """Raised by :meth:`Budget.reserve` when a call's estimate does not fit in what is left of the budget."""
