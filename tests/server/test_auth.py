"""Access control: one bearer token for every endpoint but the health check and the dashboard's files."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import httpx
import pytest

from planweave.server import TokenError, resolve_token
from planweave.server.tokens import TOKEN_ENV, TOKEN_FILE_ENV, AccessToken, default_token_path

from .conftest import Live, chain_plan, sse, start_live

PROTECTED = [
    ("GET", "/runs"), ("POST", "/runs"), ("GET", "/runs/x"), ("GET", "/runs/x/plan"), ("POST", "/runs/x/cancel"),
    ("POST", "/runs/x/resume"), ("GET", "/runs/x/events"), ("GET", "/events"),
]


@pytest.mark.parametrize("method,path", PROTECTED)
async def test_every_endpoint_wants_the_token(live: Live, method: str, path: str) -> None:
    async with live.client(token=None) as anonymous, live.client(token="not-" + live.token) as wrong:
        missing = await anonymous.request(method, path)
        bad = await wrong.request(method, path)
        basic = await anonymous.request(method, path, auth=httpx.BasicAuth("user", live.token))
    for resp in (missing, bad, basic):
        assert resp.status_code == 401, (method, path, resp.status_code)
        assert resp.headers["www-authenticate"] == "Bearer"
        assert "access token" in resp.json()["detail"]


async def test_open_endpoints_need_no_token(live: Live) -> None:
    async with live.client(token=None) as client:
        for path in ("/healthz", "/openapi.json", "/", "/static/app.js", "/static/style.css"):
            assert (await client.get(path)).status_code == 200, path


async def test_the_token_never_appears_in_the_logs(
    journal_url: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "secret-" + os.urandom(12).hex()
    async with start_live(journal_url, token=token) as live, live.client(token=token) as client:
        resp = await client.post("/runs", json={"plan": chain_plan(2, 0.0)})
        run_id = resp.json()["run_id"]
        async with client.stream("GET", f"/runs/{run_id}/events") as stream:
            [frame async for frame in sse(stream)]
        await client.post("/runs", json={"plan": {"steps": [{"id": "x", "tool": "nope"}]}})
        await client.get("/runs/unknown")
        failed = await client.post("/runs", json={"plan": {"steps": [
            {"id": "boom", "tool": "shell", "args": {"argv": ["sh", "-c", "echo failing >&2; exit 3"]}}]}})
        await live.wait(failed.json()["run_id"])
        # A client that puts the token where it does not belong (the URL) must not get it logged either.
        await client.get("/runs", params={"token": token})
        async with live.client(token=None) as anonymous:
            await anonymous.get(f"/runs?access_token={token}")
            await anonymous.get("/runs", headers={"Authorization": f"Bearer {token}x"})
    out, err = capsys.readouterr()
    # Everything but the test's own HTTP client (which logs the URLs it requests).
    server_side = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in server_side) + out + err
    assert '"POST /runs HTTP/1.1" 201' in logged  # the access log was captured...
    assert token not in logged  # ...and the token is not in it
    assert "access_token=[token]" in logged


def test_a_given_token_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment-123")
    assert resolve_token("given-explicitly-12345").value == "given-explicitly-12345"
    resolved = resolve_token(None, "memory://")
    assert (resolved.value, resolved.origin) == ("from-the-environment-123", "env")


def test_a_generated_token_is_stored_0600_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'db' / 'runs.db'}"
    first = resolve_token(None, url)
    assert first.origin == "generated" and len(first.value) >= 32
    assert first.path == tmp_path / "db" / "server-token"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    again = resolve_token(None, url)
    assert (again.value, again.origin) == (first.value, "file")
    first.path.chmod(0o644)  # someone loosened it
    assert resolve_token(None, url).value == first.value
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600


def test_without_a_sqlite_journal_the_token_lives_in_the_config_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_token_path("postgresql://db/x") == tmp_path / "planweave" / "token"
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "elsewhere"))
    assert default_token_path("sqlite:///x.db") == tmp_path / "elsewhere"


@pytest.mark.parametrize("weak", ["short", "has a space in it!!", "x" * 15])
def test_a_weak_token_is_refused(weak: str) -> None:
    with pytest.raises(TokenError, match="token"):
        resolve_token(weak)


def test_the_token_is_not_in_its_repr() -> None:
    token = AccessToken("abcdefghijklmnopqrstuvwxyz", "given")
    assert "abcdefghijklmnopqrstuvwxyz" not in repr(token)
    assert token.matches("abcdefghijklmnopqrstuvwxyz") and not token.matches("abcdefghijklmnopqrstuvwxy")
    assert not token.matches("ümlaut-and-other-things")
