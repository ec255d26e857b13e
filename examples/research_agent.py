"""A research agent: it reads a folder of notes through the MCP filesystem server, fetches one web page with
``http.get``, and writes a summary back through the server's ``write_file``, after a person approves the write.

Offline (no key, no model: the planner's answers come from examples/offline/research-agent.yaml), from the
repository's root, on a copy of the notes (the summary is written into the copy)::

    rm -rf /tmp/research-notes && cp -r examples/research-notes /tmp/research-notes
    planweave goal "Summarise my notes on durable execution with the page on idempotency keys into summary.md" \
        --tools examples.research_agent:toolbox \
        --mcp notes="npx -y @modelcontextprotocol/server-filesystem /tmp/research-notes" \
        --model scripted:examples/offline/research-agent.yaml --run-id research

The run stops at step ``write`` and waits; in another terminal, from the same directory::

    planweave approve research write

then ``cat /tmp/research-notes/summary.md``. A run id names one run of the journal: to run again, give another
``--run-id`` (or none: a waiting run prints its id and the ``planweave approve`` command). With a model (any
OpenAI-compatible endpoint: ``--base-url URL`` or ``$OPENAI_BASE_URL``)::

    export OPENAI_API_KEY=sk-...
    planweave goal "Read every note in the notes folder (the notes.* tools) and the page that site.serve \
serves (http.get, then html.text), and write a one-page summary to summary.md in the notes folder with \
notes.write_file; that write needs my approval" \
        --tools examples.research_agent:toolbox \
        --mcp notes="npx -y @modelcontextprotocol/server-filesystem /tmp/research-notes" \
        --model gpt-4o-mini --run-id research-model

The model names its own steps: approve the write with the ``planweave approve research-model STEP`` command the run
prints when it waits.

(``scripts/install-mcp-servers.sh`` puts the server in ``.cache/mcp/node_modules/.bin/mcp-server-filesystem``: give
that path instead of ``npx -y @modelcontextprotocol/server-filesystem`` to run without the network.)

What is real offline: the MCP server and every file it reads and writes, the HTTP server and the page ``http.get``
fetches from it, the planning loop, the journal and the approval. What is not: the plan and the summary's prose,
which are the script's. The web page is served on 127.0.0.1 by ``site.serve``, a tool of this module, so the
example needs no network; give a model any other URL in the goal to fetch the real web instead.
"""

from __future__ import annotations

import threading
from html.parser import HTMLParser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from planweave import Toolbox

toolbox = Toolbox()

PAGE_PATH = "/idempotency-keys.html"
PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Idempotency keys: making retries safe</title>
<style>body { font-family: sans-serif; max-width: 40em; }</style></head>
<body>
<h1>Idempotency keys: making retries safe</h1>
<p>A client that retries a request after a timeout cannot tell whether the first attempt took effect. If every
request carries an <em>idempotency key</em> (a unique id chosen by the client), the server stores the key with the
outcome of the first attempt and answers a repeated key with that stored outcome instead of acting again.</p>
<p>Three rules make it work: the key is chosen before the first attempt and reused by every retry; the server
records the key and the effect in one transaction; stored keys expire only after the client has stopped
retrying.</p>
<p>A workflow engine that runs steps at least once can derive the key from the run and the step, so a step
replayed after a crash sends the same key and the effect happens once.</p>
</body>
</html>
"""

_server_lock = threading.Lock()
_server: ThreadingHTTPServer | None = None


class _PageHandler(BaseHTTPRequestHandler):
    """Serves :data:`PAGE` at :data:`PAGE_PATH`, 404 for anything else."""

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != PAGE_PATH:
            self.send_error(HTTPStatus.NOT_FOUND, f"no page {self.path}; try {PAGE_PATH}")
            return
        body = PAGE.encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the run's live view owns the terminal."""


def serve_site() -> dict[str, str]:
    """Start (once per process) a small web server on 127.0.0.1 with one page, about idempotency keys; return
    ``url``, the page's address for ``http.get``."""
    global _server
    with _server_lock:
        if _server is None:
            _server = ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
            _server.daemon_threads = True
            threading.Thread(target=_server.serve_forever, name="research-site", daemon=True).start()
        host, port = _server.server_address[:2]
    return {"url": f"http://{host!s}:{port}{PAGE_PATH}"}


class _TextOfHtml(HTMLParser):
    """Collects a page's title and its visible text (scripts and styles left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.parts: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        if "script" in self._open or "style" in self._open:
            return
        if self._open and self._open[-1] == "title":
            self.title += data.strip()
        elif data.strip():
            self.parts.append(" ".join(data.split()))


async def html_text(html: str, max_chars: int = 4000) -> dict[str, Any]:
    """The title and the visible text of an HTML page (at most ``max_chars`` characters of text), e.g. of
    ``http.get``'s ``text``: read this rather than the raw HTML."""
    parser = _TextOfHtml()
    parser.feed(html)
    parser.close()
    text = " ".join(parser.parts)
    return {"title": parser.title, "text": text[:max_chars], "truncated": len(text) > max_chars}


# add, not the @toolbox.tool decorator: the decorator is untyped, which `mypy --strict` refuses
toolbox.add(serve_site, name="site.serve", idempotent=True)
toolbox.add(html_text, name="html.text", idempotent=True)
