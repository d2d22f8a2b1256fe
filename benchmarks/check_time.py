"""Wall time of `seeupo check NAME` with its default budget, for a built-in and a plugin algorithm.

The default check (verify cells, the five searches, the bridge) must finish within 3 minutes
on 2 CPU cores (issue 23 item 5): it plans against a 170 s budget, calibrated on the machine.
This script runs it for ``grpo`` and for the DAPO plugin of ``examples/algorithms/``, timing the
whole process (Python's start included), and reads each report's own estimate and part times.
Results: benchmarks/results/check_time.json; the table goes into benchmarks/RESULTS.md by hand.

    python benchmarks/check_time.py [--no-bridge]
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
ROOT = HERE.parent
RUNS = {"grpo": [], "dapo": ["--plugin", str(ROOT / "examples/algorithms/dapo.py")]}
LIMIT_SECONDS = 180.0


def timed_check(name: str, extra: list[str]) -> dict:
    """One default ``seeupo check`` in a fresh folder: wall seconds, exit code, the report's plan and part times."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "seeupo", "check", name, *extra, "--no-progress", "--out", out],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        report = json.loads((Path(out) / "check.json").read_text()) if (Path(out) / "check.json").exists() else {}
    return {"algorithm": name, "wall_seconds": round(seconds, 1), "returncode": done.returncode,
            "estimate_seconds": round(report.get("plan", {}).get("total", float("nan")), 1),
            "parts_seconds": {k: round(v, 1) for k, v in report.get("times", {}).items()},
            "max_examples": report.get("budget", {}).get("max_examples"),
            "iterations": report.get("budget", {}).get("verify", {}).get("iterations"),
            "bridge_seeds": report.get("budget", {}).get("bridge_seeds"),
            "verdict": (report.get("monotonicity") or {}).get("measured"), "stderr_tail": done.stderr[-400:],
            "within_limit": seconds <= LIMIT_SECONDS}


def main() -> None:
    extra = [a for a in sys.argv[1:] if a == "--no-bridge"]
    load_before = os.getloadavg()
    runs = [timed_check(name, flags + extra) for name, flags in RUNS.items()]
    result = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "flags": extra, "limit_seconds": LIMIT_SECONDS, "runs": runs,
    }
    path = HERE / "results" / "check_time.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    for r in runs:
        print(f"check {r['algorithm']}{' ' + ' '.join(extra) if extra else ''}: {r['wall_seconds']} s wall "
              f"(estimate {r['estimate_seconds']} s; parts {r['parts_seconds']}; {r['iterations']} iterations, "
              f"{r['max_examples']} cases per search, bridge seeds {r['bridge_seeds']}), "
              f"exit {r['returncode']}, verdict {r['verdict']}")
    print(f"load average before {result['load_average_before']}, after {result['load_average_after']}; wrote {path}")


if __name__ == "__main__":
    main()
