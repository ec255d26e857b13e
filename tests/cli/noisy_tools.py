"""Tools that print: to ``sys.stdout``, straight to file descriptor 1, and from a child process inheriting it.

Imported by ``planweave run --tools noisy_tools:toolbox`` in subprocesses (with this directory on PYTHONPATH).
"""

from __future__ import annotations

import os
import subprocess
import sys

from planweave import Toolbox


def chatty(word: str) -> dict[str, str]:
    """Print ``word`` three ways, then return it (a plain function: the engine runs it in a thread)."""
    print(f"print says {word}")
    sys.stdout.flush()
    os.write(1, f"fd 1 says {word}\n".encode())
    subprocess.run([sys.executable, "-c", f"print('child says {word}')"], check=True)
    return {"word": word}


toolbox = Toolbox()
toolbox.add(chatty, idempotent=True)
