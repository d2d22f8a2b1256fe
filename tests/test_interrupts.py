"""Worker processes leave Ctrl-C to their parent, even one that arrives while they start."""

import subprocess
import sys

import pytest

# a worker still starting when Ctrl-C reaches it (the parent signals it before its initializer runs)
STARTING_WORKER = '''
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time

from seeupo.interrupts import ignore_interrupts_in_worker, interrupts_held_for_new_processes


def worker(path):
    open(path + ".started", "w").close()
    while not os.path.exists(path + ".sent"):
        time.sleep(0.01)
    ignore_interrupts_in_worker()
    time.sleep(0.2)


if __name__ == "__main__":
    held, path = sys.argv[1] == "held", sys.argv[2]
    process = mp.get_context("spawn").Process(target=worker, args=(path,))
    with interrupts_held_for_new_processes() if held else contextlib.nullcontext():
        process.start()
    while not os.path.exists(path + ".started"):
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGINT)
    open(path + ".sent", "w").close()
    process.join()
    print(process.exitcode)
'''


@pytest.mark.parametrize("held", [True, False])
def test_a_worker_started_with_interrupts_held_ignores_a_ctrl_c_that_arrives_while_it_starts(tmp_path, held):
    """Held: the worker ends normally and prints nothing. Not held (the contrast that shows the test can
    fail): the same Ctrl-C ends it with a KeyboardInterrupt traceback."""
    script = tmp_path / "starting_worker.py"
    script.write_text(STARTING_WORKER)
    proc = subprocess.run([sys.executable, str(script), "held" if held else "not held", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if held:
        assert proc.stdout.strip() == "0" and proc.stderr == ""
    else:
        assert proc.stdout.strip() == "1" and "KeyboardInterrupt" in proc.stderr
