"""Optional parts of planweave and the check that names the extra to install when one is missing.

``pip install planweave`` brings the engine, the SQLite journal, the CLI and the built-in tools. The rest comes with
extras (``pip install 'planweave[server]'``); each place that imports an optional library calls :func:`require`
first, so using a feature without its extra is a :class:`MissingExtra` (a planweave error: the CLI prints it and
exits 2) instead of a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib.util

from planweave.core.errors import PlanweaveError

EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn"),
    "postgres": ("psycopg",),
    "mcp": ("mcp",),
    "a2a": ("a2a", "fastapi", "uvicorn"),  # planweave.server.a2a: an A2A agent on the server
    "telemetry": ("opentelemetry.sdk", "fastapi", "uvicorn"),  # tracing lives in planweave.server
    "local": ("llama_cpp",),
    "ray": ("ray",),
    "control": ("gymnasium", "numpy"),
    "rollouts": ("pyarrow", "redis"),
    "rollouts-example": ("numpy", "matplotlib"),
    "memory": ("rank_bm25",),
    "memory-embed": ("rank_bm25", "tokenizers", "safetensors", "numpy"),  # + the model package (memory/embed.py)
}
"""Each extra and the top-level modules whose presence shows it is installed (as pyproject.toml declares them)."""


class MissingExtra(PlanweaveError):
    """A feature was used whose optional dependencies are not installed; the message says which extra brings them."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        self.feature = feature
        self.extra = extra
        self.module = module
        super().__init__(f"{feature} needs the '{extra}' extra: pip install 'planweave[{extra}]' "
                         f"(from a checkout of the repository: pip install '.[{extra}]'; module '{module}' is not "
                         "installed)")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (a dotted name imports only its parents)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package of a dotted name is missing
        return False


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` unless every module of ``extra`` (see :data:`EXTRAS`) is there.

    ``feature`` opens the message, e.g. ``"the server"`` → "the server needs the 'server' extra: pip install ...".
    Cheap (no import), so it can run before every use.
    """
    for module in EXTRAS[extra]:
        if not installed(module):
            raise MissingExtra(feature, extra, module)
