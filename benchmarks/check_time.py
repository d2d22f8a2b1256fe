"""Wall time of `seeupo check NAME` against its own estimate, idle and under load.

`seeupo check` plans against a budget (170 s by default, 60 s with ``--quick``), calibrated on the
machine before it starts, and prints an estimate. Issue 32 asks that the estimate be within 1.5x
of the wall time on an idle machine, and that the budget hold under a load of 4 (shrinking
counts inside each search's share). This script runs the check for ``grpo`` and for the DAPO
plugin of ``examples/algorithms/``, timing the whole process (Python's start included), and
reads each report's own estimate and part times. ``--load N`` first starts N busy-loop processes
(each one CPU-bound Python loop) and stops them at the end, so "under a load of 4" on 2 cores is
``--load 4``.

Results: benchmarks/results/check_time[_quick][_loadN].json; the table goes into
benchmarks/RESULTS.md by hand.

    python benchmarks/check_time.py [--quick] [--no-bridge] [--load N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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
ESTIMATE_RATIO = 1.5  # issue 32: the estimate within 1.5x of the wall time (either way), on an idle machine


def busy() -> None:
    """One CPU-bound loop, until terminated."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


def timed_check(name: str, extra: list[str]) -> dict:
    """One ``seeupo check`` in a fresh folder: wall seconds, exit code, the report's plan, budget and part times."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "seeupo", "check", name, *extra, "--no-progress", "--out", out],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        report = json.loads((Path(out) / "check.json").read_text()) if (Path(out) / "check.json").exists() else {}
    plan = report.get("plan", {})
    estimate = plan.get("total", float("nan"))
    budget = plan.get("budget")
    ratio = seconds / estimate if estimate == estimate and estimate > 0 else float("nan")
    return {"algorithm": name, "wall_seconds": round(seconds, 1), "returncode": done.returncode,
            "estimate_seconds": round(estimate, 1), "budget_seconds": budget, "wall_over_estimate": round(ratio, 2),
            "estimate_within": bool(1 / ESTIMATE_RATIO <= ratio <= ESTIMATE_RATIO),
            "within_budget": budget is None or seconds <= budget,
            "parts_seconds": {k: round(v, 1) for k, v in report.get("times", {}).items()},
            "max_examples": report.get("budget", {}).get("max_examples"),
            "iterations": report.get("budget", {}).get("verify", {}).get("iterations"),
            "bridge_seeds": report.get("budget", {}).get("bridge_seeds"),
            "verdict": (report.get("monotonicity") or {}).get("measured"),
            "gradient": (report.get("gradient") or {}).get("direction"), "stderr_tail": done.stderr[-400:]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="time `check --quick` (60 s budget)")
    p.add_argument("--no-bridge", action="store_true", help="pass --no-bridge")
    p.add_argument("--load", type=int, default=0, help="busy-loop processes running meanwhile (default 0)")
    args = p.parse_args()
    extra = ["--quick"] * args.quick + ["--no-bridge"] * args.no_bridge
    loaders = [mp.Process(target=busy, daemon=True) for _ in range(args.load)]
    for proc in loaders:
        proc.start()
    try:
        time.sleep(5 if loaders else 0)  # let the load average see them
        load_before = os.getloadavg()
        runs = [timed_check(name, flags + extra) for name, flags in RUNS.items()]
        load_after = os.getloadavg()
    finally:
        for proc in loaders:
            proc.terminate()
    result = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "extra_load_processes": args.load, "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after], "flags": extra, "runs": runs,
    }
    suffix = "_quick" * args.quick + "_nobridge" * args.no_bridge + (f"_load{args.load}" if args.load else "")
    path = HERE / "results" / f"check_time{suffix}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    for r in runs:
        print(f"check {r['algorithm']} {' '.join(extra)}: {r['wall_seconds']} s wall, estimate {r['estimate_seconds']} s "
              f"(wall/estimate {r['wall_over_estimate']}), budget {r['budget_seconds']} s; parts {r['parts_seconds']}; "
              f"{r['iterations']} iterations, {r['max_examples']} cases per search, bridge seeds {r['bridge_seeds']}; "
              f"exit {r['returncode']}, verdict {r['verdict']}, gradient {r['gradient']}")
    print(f"load average before {result['load_average_before']}, after {result['load_average_after']}; wrote {path}")


if __name__ == "__main__":
    main()
