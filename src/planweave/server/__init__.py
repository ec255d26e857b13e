"""The HTTP server: a FastAPI app over an engine, the live dashboard, and optional OpenTelemetry tracing.

An adapter around the engine: it imports the runtime and the journal, and nothing in the core imports it.
Tracing lives in :mod:`planweave.server.telemetry`, imported only when enabled (it needs OpenTelemetry).
"""

from planweave.server.app import LiveServer, ServerError, create_app, serve, serving, telemetry_from_env
from planweave.server.streams import StreamTiming
from planweave.server.tokens import AccessToken, TokenError, resolve_token

__all__ = [
    "AccessToken",
    "LiveServer",
    "ServerError",
    "StreamTiming",
    "TokenError",
    "create_app",
    "resolve_token",
    "serve",
    "serving",
    "telemetry_from_env",
]
