"""A test's script run in a fresh Python process, where an environment variable must be set before numba loads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def under_workqueue(script: str) -> str:
    """Run ``script`` (dedented) with numba's "workqueue" threading layer, which aborts on concurrent parallel
    calls; return what it printed (an error shows the end of its stderr)."""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()
