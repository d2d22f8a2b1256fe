"""Wall time of `seeupo verify` with its defaults, against the same run on one worker.

Both runs happen in this script, one after the other, so their ratio is measured on the
same machine under the same load. Results: benchmarks/results/verify_time.json and a line
in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed_verify(*extra: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "seeupo.cli", "verify", "--no-progress", "--out", out, *extra],
            check=True, stdout=subprocess.DEVNULL,
        )
        return time.perf_counter() - start


def main() -> None:
    import torch

    default = timed_verify()
    one_worker = timed_verify("--workers", "1")
    quick = timed_verify("--quick")
    result = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "verify_default_seconds": round(default, 2),
        "verify_default_one_worker_seconds": round(one_worker, 2),
        "speedup_of_default_over_one_worker": round(one_worker / default, 2),
        "verify_quick_seconds": round(quick, 2),
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "verify_time.json").write_text(json.dumps(result, indent=1) + "\n")
    line = (
        f"- {result['timestamp']} verify_time: `seeupo verify` (defaults, 2 workers) {default:.1f} s; "
        f"1 worker {one_worker:.1f} s (x{one_worker / default:.2f}); `--quick` {quick:.1f} s "
        f"({result['cpu_count']} CPUs, 1-min load {result['load_average_1min_at_end']}, torch {result['torch']})\n"
    )
    with open(HERE / "RESULTS.md", "a") as f:
        f.write(line)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
