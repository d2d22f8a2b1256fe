"""Ctrl-C at any moment of a ``seeupo`` command: exit status 130 and one line on stderr, never a traceback.

The commands that handle Ctrl-C themselves (verify, search, check, eval: partial results) are tested
with them; these tests cover the rest of a command's life, above all its first seconds, while it
imports torch. One test interrupts deterministically (an import hook sends SIGINT to the process
when torch starts to import); the other is a real ``python -m seeupo`` process interrupted from
outside once torch's libraries are being loaded. Neither depends on how fast the machine is: they
wait for the process with a long timeout and assert no durations.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seeupo.cli import main

REPO = Path(__file__).resolve().parents[2]
COMMAND = ["check", "seeupo", "--quick", "--no-bridge", "--no-progress"]
WAIT = 600  # seconds: generous, for a busy machine (the process normally ends within a second of the signal)

# runs `python -m seeupo ARGS` after installing an import hook that sends this process SIGINT the moment
# `import torch` begins: Python's default handler raises KeyboardInterrupt inside the import machinery
SIGINT_ON_IMPORT_TORCH = """
import os, runpy, signal, sys

class SigintOnTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnTorch())
sys.argv = ["seeupo", *sys.argv[1:]]
runpy.run_module("seeupo", run_name="__main__", alter_sys=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_ctrl_c_while_a_command_imports_torch_is_one_line_and_130(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SIGINT_ON_IMPORT_TORCH, *COMMAND, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=WAIT, cwd=tmp_path, env=_env())
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr == "seeupo check: interrupted\n"


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # the process ended
        return ""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see when torch is loading")
def test_ctrl_c_in_the_first_seconds_of_python_m_seeupo(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "seeupo", *COMMAND, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env())
    # wait (as long as it takes) until the command has started to import torch: its libraries are mapped
    deadline = time.monotonic() + WAIT
    while proc.poll() is None and "libtorch" not in _maps(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the command ended before it imported torch"
    time.sleep(0.5)  # well inside torch's import, which runs for seconds after its libraries are mapped
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=WAIT)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    if stderr != "seeupo check: interrupted\n":
        # the machine was so slow that the imports were over: check itself stopped and wrote its partial report
        assert stderr == "" and (out / "check.json").exists(), stderr[-3000:]


def test_main_reports_an_interrupt_it_does_not_handle(monkeypatch, capsys):
    import seeupo.cli.presets as presets

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(presets, "run", interrupted)
    assert main(["presets"]) == 130
    assert capsys.readouterr().err == "seeupo presets: interrupted\n"


# runs `seeupo check ...` with its calibration preceded by a lazy torch import, during which the process gets SIGINT
# from inside torch's own module code (a submodule torch.utils.benchmark imports): where the command line's handler
# would end the process at once, the check's watch defers the interrupt to its next checkpoint
SIGINT_IN_A_LAZY_TORCH_IMPORT = """
import os, runpy, signal, sys

class SigintOn:
    def find_spec(self, name, path=None, target=None):
        if name == "torch.utils.benchmark.utils.timer":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

import seeupo.experiments.check.run as run
real = run.calibrate

def calibrate(*args, **kwargs):
    sys.meta_path.insert(0, SigintOn())
    import torch.utils.benchmark  # noqa: F401
    return real(*args, **kwargs)

run.calibrate = calibrate
sys.argv = ["seeupo", *sys.argv[1:]]
runpy.run_module("seeupo", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_inside_a_lazy_torch_import_of_a_check_writes_its_partial_report(tmp_path):
    """The command line ends a process at once when Ctrl-C lands in torch's import (its C extension would discard the
    interrupt); inside a check that used to leave an empty folder. The check defers it and writes its report."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", SIGINT_IN_A_LAZY_TORCH_IMPORT, *COMMAND, "--out", str(out)],
                          capture_output=True, text=True, timeout=WAIT, cwd=tmp_path, env=_env())
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = (out / "check.json").read_text()
    assert '"partial": "SIGINT"' in report


def test_an_interrupted_command_leaves_no_empty_folder(tmp_path, monkeypatch, capsys):
    """A command stopped before it wrote anything removes the output folder it made; one that wrote keeps it."""
    import seeupo.cli.presets as presets
    from seeupo.validation.arguments import writable_dir

    def made_then_interrupted(args):
        writable_dir(tmp_path / "a" / "out", "--out")
        raise KeyboardInterrupt

    monkeypatch.setattr(presets, "run", made_then_interrupted)
    assert main(["presets"]) == 130
    assert not (tmp_path / "a").exists()

    def wrote_then_interrupted(args):
        (writable_dir(tmp_path / "b", "--out") / "partial.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(presets, "run", wrote_then_interrupted)
    assert main(["presets"]) == 130
    assert (tmp_path / "b" / "partial.json").exists()
