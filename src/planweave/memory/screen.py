"""What a model may not write into memory: the rules verification and recall apply to an entry (pure).

Everything in a memory entry was written by a model (the distiller) that read a run's tool outputs, so it is
untrusted: a prompt injected into a web page can come back as a "lesson". Three questions are answered here, without
I/O:

* **May it be replayed?** (:func:`replay_screen`) A replay or a check runs on the engine with real tools, so only
  steps that can run again without anybody noticing are run: the tool itself is idempotent (a step's own
  ``idempotent: true`` is the model's word and does not count), no ``writes:``, no ``approval:``, not
  ``human.input`` — the same for a fallback. A step that calls a non-idempotent tool, or that drops an approval the
  source run had for that tool, makes the entry *refused*; a step that waits for a person (or claims ``writes:``)
  leaves it *for a person*.
* **Can the check fail?** (:func:`check_screen`) A lesson's check is one step plus ``expect`` (``{"path"?:
  "a.b[0]", "equals": V}`` or ``{"path"?: ..., "contains": V}``) compared with its output. A check without
  ``expect``, on a tool that returns what it is given (``noop``, ``sleep``), expecting one of its own arguments or
  an empty text, cannot fail: it is no verification and the lesson waits for a person.
* **May it reach a planner?** (:func:`content_screen`) An entry naming a host its source run never used (the goal
  and the source plan's step arguments, recorded as the entry's ``hosts``), or asking to send a secret, is refused
  at verification, at a person's admission and again at recall.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.refs import RefResolutionError, RefSyntaxError, parse_ref
from planweave.memory.model import MemoryEntry, instantiate

__all__ = ["ECHO_TOOLS", "Screen", "check_screen", "content_screen", "expectation_failure", "hosts_in",
           "replay_screen", "secret_request"]

ECHO_TOOLS = frozenset({"noop", "sleep"})  # return what they are given (or a constant): a check on them holds always

# A host is what follows a scheme, an address's '@' or 'www.', a dotted name followed by '/' or ':port', a dotted
# name ending in a common top-level domain, 'localhost' or an IPv4 address. Bare names such as tool names
# ('http.get', 'context.read') or files ('notes.md', 'main.py') are not hosts.
_TLDS = ("com|net|org|io|dev|ai|app|co|info|biz|xyz|example|test|invalid|local|localhost|internal|site|online|top|"
         "cloud|gov|edu|me|us|uk|de|fr|ru|cn|jp|nl|eu|tk|ws|cc|ly|gg|sh|to|link|click|zip|onion")
_HOST_PATTERNS = (
    re.compile(r"[a-z][a-z0-9+.-]*://(?:[^\s/@?#'\"<>]+@)?(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)", re.IGNORECASE),
    re.compile(r"(?<![\w.-])[\w.+-]+@((?:[a-z0-9-]+\.)+[a-z]{2,63})\b", re.IGNORECASE),
    re.compile(r"(?<![\w./-])((?:[a-z0-9-]+\.)+[a-z]{2,63})(?=/|:\d)", re.IGNORECASE),
    re.compile(rf"(?<![\w.-])((?:[a-z0-9-]+\.)+(?:{_TLDS}))(?![\w-])(?!\.\w)", re.IGNORECASE),
    re.compile(r"(?<![\w.-])(www\.[a-z0-9.-]+|localhost|\d{1,3}(?:\.\d{1,3}){3})(?![\w-])", re.IGNORECASE),
)

_SECRET = re.compile(
    r"\b(?:api[\s_-]?keys?|access[\s_-]?keys?|secret[\s_-]?keys?|private[\s_-]?keys?|ssh[\s_-]?keys?|"
    r"(?:access|auth|api|bearer|refresh|session|github|oauth)[\s_-]?tokens?|client[\s_-]?secrets?|secrets|"
    r"passwords?|passphrases?|credentials?|authorization[\s_-]?headers?|cookies?|session[\s_-]?ids?|"
    r"(?-i:[A-Z][A-Z0-9_]*_(?:KEY|TOKEN|SECRET|PASSWORD)))\b", re.IGNORECASE)
_SEND = re.compile(
    r"\b(?:send|sends|sending|sent|post|posts|posting|upload|uploads|forward|forwards|share|shares|include|includes|"
    r"attach|attaches|e-?mail|transmit|exfiltrate|leak|leaks|copy|copies|paste|submit|publish|expose|report|"
    r"reports|echo|print|log|put|append|deliver|pass|passes|give)\b", re.IGNORECASE)


def _texts(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _texts(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _texts(item)


def hosts_in(value: Any) -> frozenset[str]:
    """The hosts named anywhere in ``value`` (texts, and the keys and values of objects and lists), lower case."""
    found: set[str] = set()
    for text in _texts(value):
        for pattern in _HOST_PATTERNS:
            found.update(m.group(1).lower().rstrip(".") for m in pattern.finditer(text) if m.group(1).strip("."))
    return frozenset(h for h in found if h)


def secret_request(text: str) -> str | None:
    """What ``text`` asks to send of a secret (``'send ... api key'``), or None: a secret named together with a
    verb of sending anywhere in it."""
    secret, send = _SECRET.search(text), _SEND.search(text)
    if secret is None or send is None:
        return None
    return f"asks to {send.group(0).lower()} a secret ('{secret.group(0)}')"


def _entry_texts(entry: MemoryEntry) -> Any:
    """Everything of ``entry`` a planner or a replay would see: text, steps (as written and with the parameters
    filled in), parameters and check."""
    filled = instantiate(entry.steps, entry.params) if entry.steps else []
    return [entry.name, entry.text, [dict(s) for s in entry.steps], filled, dict(entry.params), entry.check]


def content_screen(entry: MemoryEntry) -> str | None:
    """Why ``entry`` may never reach a planner (an unvouched host, a request for a secret), or None."""
    parts = _entry_texts(entry)
    unvouched = sorted(hosts_in(parts) - set(entry.hosts))
    if unvouched:
        return (f"it names host {', '.join(unvouched[:3])}, which its source run never used "
                f"(it used {', '.join(sorted(entry.hosts)) or 'none'})")
    asked = secret_request("\n".join(_texts(parts)))
    return asked


@dataclass(frozen=True)
class Screen:
    """What verification does with an entry: ``replay`` it, leave it for a ``person`` or ``refuse`` it; ``why``
    names the step and the rule."""

    verdict: Literal["replay", "person", "refuse"]
    why: str = ""


REPLAY = Screen("replay")


def _tool_of(step: Mapping[str, Any]) -> str:
    return str(step.get("tool", ""))


def _step_screen(where: str, step: Mapping[str, Any], tools: ToolCatalog,
                 approved_tools: Mapping[str, str]) -> Screen:
    """One step (a skill's or a check) against the replay rules; ``approved_tools``: tool -> the source run's step
    that called it behind an approval."""
    calls: list[tuple[str, str]] = [(where, _tool_of(step))]
    fallback = step.get("fallback")
    if isinstance(fallback, Mapping):
        calls.append((f"{where}'s fallback", _tool_of(fallback)))
    refusals: list[str] = []
    for who, tool in calls:
        if tool in approved_tools and not step.get("approval"):
            refusals.append(f"{who} calls '{tool}' without the approval the source run's step "
                            f"'{approved_tools[tool]}' waited for")
        spec = tools.get(tool)
        if spec is not None and (not spec.idempotent or step.get("idempotent") is False):
            refusals.append(f"{who} calls '{tool}', which is not idempotent: running it again would repeat its "
                            "effect")
    if refusals:
        return Screen("refuse", "; ".join(refusals))
    if step.get("approval"):
        return Screen("person", f"{where} waits for an approval")
    if "human.input" in (tool for _, tool in calls):
        return Screen("person", f"{where} waits for a person's input")
    if step.get("writes"):
        return Screen("person", f"{where} claims writes: {', '.join(map(str, step['writes']))}")
    return REPLAY


def replay_screen(steps: Sequence[Mapping[str, Any]], tools: ToolCatalog,
                  approved_tools: Mapping[str, str]) -> Screen:
    """Whether ``steps`` (a skill's, or a check as one step) may be replayed with ``tools``: refused if any step
    would repeat an effect or drops an approval of the source run, for a person if one waits for somebody;
    tools the catalog does not have are left to the engine (the run cannot start)."""
    waits: list[str] = []
    for step in steps:
        screen = _step_screen(f"step '{step.get('id', '?')}'", step, tools, approved_tools)
        if screen.verdict == "refuse":
            return screen
        if screen.verdict == "person":
            waits.append(screen.why)
    return Screen("person", "; ".join(waits)) if waits else REPLAY


def _path_ref(path: str) -> str:
    return "check" + (path if path.startswith("[") else f".{path}") if path else "check"


def _contains_value(haystack: Any, needle: Any) -> bool:
    if isinstance(haystack, str):
        return isinstance(needle, str) and needle in haystack
    if isinstance(haystack, Mapping):
        return needle in haystack or any(_contains_value(v, needle) for v in haystack.values())
    if isinstance(haystack, (list, tuple)):
        return needle in haystack or any(_contains_value(v, needle) for v in haystack)
    return bool(haystack == needle)


def check_screen(check: Mapping[str, Any]) -> str | None:
    """Why ``check`` cannot fail (so is no verification), or None when its output is compared to something its
    own arguments do not give away."""
    expect = check.get("expect")
    tool = _tool_of(check)
    if tool in ECHO_TOOLS:
        return f"its tool '{tool}' returns what it is given"
    if not isinstance(expect, Mapping):
        return "its output is not compared to anything (add \"expect\": {\"path\": ..., \"equals\": ...})"
    ops = [op for op in ("equals", "contains") if op in expect]
    extra = sorted(set(expect) - {"path", "equals", "contains"})
    if len(ops) != 1 or extra:
        return "its expect must hold one of equals or contains (and an optional path)"
    path = expect.get("path", "")
    if not isinstance(path, str):
        return "its expect path must be a text such as 'items[0].name'"
    try:
        parse_ref(_path_ref(path))
    except RefSyntaxError as exc:
        return f"its expect path cannot be read: {exc}"
    wanted = expect[ops[0]]
    if ops[0] == "contains" and wanted in ("", [], {}):
        return "it expects an empty value, which every output contains"
    if _contains_value(check.get("args", {}), wanted):
        return "it expects a value given in its own arguments (an echo would pass)"
    return None


def expectation_failure(expect: Mapping[str, Any], output: Any) -> str | None:
    """Why ``output`` does not meet ``expect`` (a check that :func:`check_screen` accepted), or None."""
    path = str(expect.get("path", ""))
    try:
        value = parse_ref(_path_ref(path)).resolve({"check": output})
    except (RefResolutionError, RefSyntaxError) as exc:
        return str(exc)
    shown = json.dumps(value, default=str)[:200]
    if "equals" in expect:
        return None if value == expect["equals"] else (
            f"{path or 'the output'} is {shown}, not {json.dumps(expect['equals'], default=str)[:200]}")
    wanted = expect["contains"]
    comparable = isinstance(value, (list, tuple, Mapping)) or (isinstance(value, str) and isinstance(wanted, str))
    held = comparable and wanted in value
    return None if held else f"{path or 'the output'} ({shown}) does not contain " \
                             f"{json.dumps(wanted, default=str)[:200]}"
