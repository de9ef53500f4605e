"""The process baseline of the Lattigo memory model (backends/lattigo_memory.py:
BASELINE_BYTES): the resident set of a Python process that has imported slotplan's command
line (what `slotplan run` loads), its runner and the Lattigo extension and started its Go
runtime, before any plan is loaded.

Run from the repository root: PYTHONPATH=. .venv/bin/python scripts/process_baseline.py
"""

import api.cli  # noqa: F401  (the `slotplan` entry point)
import backends.lattigo_backend as lb
import backends.runner  # noqa: F401


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


print(f"extension {lb.version()}: VmRSS {rss_bytes()} B ({rss_bytes() / 2**20:.0f} MiB)")
