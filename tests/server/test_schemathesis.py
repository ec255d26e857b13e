"""Property-based API tests from the served /openapi.json: no input, valid or not, makes the server answer 5xx."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from planweave import Engine, Toolbox, builtin_tools, open_engine
from planweave.journal import MemoryJournal
from planweave.server import LiveServer, StreamTiming, create_app

from .conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server on its own thread and event loop (schemathesis calls it synchronously)."""
    journal = f"sqlite:///{tmp_path_factory.mktemp('schemathesis') / 'runs.db'}"
    # Only noop: generated plans that happen to be valid must do nothing and end at once.
    tools = Toolbox({"noop": builtin_tools()["noop"]})
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with open_engine(journal, tools=tools) as engine:
            app = create_app(engine, TOKEN, timing=StreamTiming(ping_interval=1.0, follow_interval=0.2))
            async with LiveServer(app, "127.0.0.1", 0, log_config=None) as server:
                box.update(url=server.url, server=server, loop=asyncio.get_running_loop())
                started.set()
                await server.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=run, name="schemathesis-server")
    thread.start()
    assert started.wait(30) and "url" in box, f"the server did not start: {box.get('error')!r}"
    yield box["url"]
    box["loop"].call_soon_threadsafe(box["server"].stop)
    thread.join(30)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")


def _openapi() -> dict[str, Any]:
    # The document the server serves; building the app needs no running server (test_api checks it is served).
    return create_app(Engine(MemoryJournal()), TOKEN).openapi()


# GET /events never ends by design (it follows the whole journal): it is tested in test_sse.py.
schema = schemathesis.openapi.from_dict(_openapi()).exclude(path="/events")


def test_the_served_schema_is_the_one_tested(server_url: str) -> None:
    served = httpx.get(server_url + "openapi.json").json()
    assert served == _openapi()


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
def test_no_request_makes_the_server_fail(case: schemathesis.Case[Any], server_url: str) -> None:
    case.call_and_validate(base_url=server_url.rstrip("/"), headers=AUTH, checks=[not_a_server_error], timeout=15)
