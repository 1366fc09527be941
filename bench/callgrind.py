"""Instructions an operation costs, as valgrind's callgrind counts them (deterministic to a few
instructions, so two versions of the code compare where this machine's timings cannot).

``per_item(script, args, count)`` runs ``script`` twice under callgrind, with ``--count`` at
``count`` and at ten times more (and ``args``), and divides the difference of the two totals by
the difference of the counts: the imports and the set-up cancel out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence


def per_item(script: str, args: Sequence[str], count: int) -> int:
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    totals = []
    for n in (count, 11 * count):
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
             script, "--count", str(n), *args],
            capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
            check=False)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"callgrind failed: {done.stderr.strip()[-500:]}")
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) // (10 * count)
