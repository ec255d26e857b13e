"""The HTTP server: a FastAPI app over an engine, the live dashboard, and optional OpenTelemetry tracing.

An edge around the engine: it imports the runtime, the journal and the plan model, and nothing imports it but the
CLI. ``app`` holds the routes and :func:`serve`; ``live`` runs uvicorn in the engine's event loop; ``runs`` folds
the journal for the API; ``streams`` turns journaled events into SSE, a page at a time; ``connections`` bounds the
clients' connections; ``tokens`` guards access. Tracing lives in :mod:`planweave.server.telemetry`, imported only
when enabled (it needs the OpenTelemetry SDK).
"""

try:
    from planweave.server.app import create_app, serve, serving, telemetry_from_env
    from planweave.server.connections import ConnectionLimits
    from planweave.server.live import LiveServer, ServerError
    from planweave.server.streams import StreamLimits, StreamTiming
    from planweave.server.tokens import AccessToken, TokenError, resolve_token
except ModuleNotFoundError:  # FastAPI or uvicorn: name the extra that brings them
    from planweave.extras import require

    require("server", "planweave.server")
    raise

__all__ = [
    "AccessToken",
    "ConnectionLimits",
    "LiveServer",
    "ServerError",
    "StreamLimits",
    "StreamTiming",
    "TokenError",
    "create_app",
    "resolve_token",
    "serve",
    "serving",
    "telemetry_from_env",
]
