"""A coding agent: it runs a project's tests with ``shell`` (confined by ``--workdir`` and ``--allow-exec``), reads the
failure and the source, proposes a patch, writes it with ``file.write`` once a person approves the patch, and runs
the tests again.

Offline (no key, no model: the planner's answers come from examples/offline/coding-agent.yaml), from the
repository's root, with ``pytest`` on your ``PATH`` (``source .venv/bin/activate``), on a copy of the tiny project
(``median`` is wrong for an even number of values, and one of its four tests says so)::

    rm -rf /tmp/stats-project && cp -r examples/coding-agent/project /tmp/stats-project
    planweave goal "Make the failing test of the project pass" \
        --tools examples.coding_agent:toolbox --workdir /tmp/stats-project --allow-exec pytest \
        --model scripted:examples/offline/coding-agent.yaml --run-id fix-median

The first test run fails, the agent proposes a patch to stats.py and waits at step ``fix``; in another terminal,
from the same directory, read the patch and approve it::

    planweave output fix-median patch       (its "diff": a unified diff, one line per item)
    planweave approve fix-median fix        (or: planweave approve fix-median fix --reject --reason "not this way")

then the tests run again and pass (``planweave show fix-median --step retest`` has their output). A rejected patch
is not written: the step fails (kind ``rejected``) and the planner is asked to repair it; this script has no other
patch, so the run ends without the fix, where a model may propose another one. A run id names one run of the
journal: to run again, give another ``--run-id`` (or none: a waiting run prints its id and the ``planweave approve``
command). With a model (any
OpenAI-compatible endpoint: ``--base-url URL`` or ``$OPENAI_BASE_URL``)::

    export OPENAI_API_KEY=sk-...
    planweave goal "The tests of the project in the work directory fail. Run them with shell \
(argv [pytest, -q, -p, no:cacheprovider], check false), read the failure and the source with file.read, \
propose the smallest fix with patch.propose, write it with file.write (that step needs my approval), then run \
the tests again (check true)" \
        --tools examples.coding_agent:toolbox --workdir /tmp/stats-project --allow-exec pytest \
        --model gpt-4o-mini --run-id fix-median-model

The model names its own steps: approve the write with the ``planweave approve fix-median-model STEP`` command the
run prints when it waits (``planweave show fix-median-model --step STEP`` shows the arguments it will write).

Confinement: ``shell`` may run ``pytest`` only, with its cwd inside ``--workdir``; ``file.*`` reach only that folder
(``--root`` defaults to it). pytest runs the project's own code, which the agent may change: the approval before
the write is what keeps a person in charge of it; the jail confines paths and programs, it is not an OS sandbox
(docs/tools.md, "Threat model").
"""

from __future__ import annotations

import difflib
from typing import Any

from planweave import Toolbox, ToolError

toolbox = Toolbox()


async def propose_patch(path: str, text: str, old: str, new: str) -> dict[str, Any]:
    """Propose a patch of the file ``path`` whose content is ``text`` (e.g. ``file.read``'s ``text``): ``old``, which
    must occur exactly once, replaced by ``new``. Writes nothing: returns ``path``, the patched ``text`` (for
    ``file.write``) and ``diff``, the unified diff for a person to read (a list of its lines)."""
    count = text.count(old) if old else 0
    if count != 1:
        found = "does not occur" if count == 0 else f"occurs {count} times"
        raise ToolError(f"patch.propose: the text to replace {found} in {path}; quote exactly one passage of it",
                        kind="arguments", retryable=False)
    patched = text.replace(old, new, 1)
    diff = list(difflib.unified_diff(text.splitlines(), patched.splitlines(), fromfile=f"a/{path}",
                                     tofile=f"b/{path}", lineterm=""))
    return {"path": path, "text": patched, "diff": diff}


# add, not the @toolbox.tool decorator: the decorator is untyped, which `mypy --strict` refuses
toolbox.add(propose_patch, name="patch.propose", idempotent=True)
