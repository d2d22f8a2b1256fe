"""AppWorld (Trivedi et al., 2024) as an :class:`~seeupo.llm.agent.Environment`: ReAct turns of Python code.

``appworld`` pins pydantic 1.x, so it cannot live in seeupo's environment: it runs in its own
virtual environment (``make appworld-env`` creates ``.venv-appworld``) inside a separate process,
:mod:`seeupo.llm.envs.appworld_server`, spoken to over line-delimited JSON on stdin/stdout. The
model's code is executed there by AppWorld's own sandboxed ``world.execute`` (its syntax safety
checks, patched unsafe modules and time limit), never in this process.

**Processes.** One server process holds one task world at a time (AppWorld freezes the process's
clock to the task's date and keys its in-memory databases by task id), so each environment —
one per trajectory — holds one process for the length of its episode. Processes are recycled
through a :class:`ServerPool` (importing ``appworld`` takes seconds): an environment takes one at
``reset`` and gives it back when the episode ends (``done``), on :meth:`AppWorldEnv.close`, or when
it is garbage-collected; the pool keeps at most ``pool_size`` idle processes and shuts the rest
down. Every process is also shut down at interpreter exit (``weakref.finalize``), and a process
that dies, or does not answer in time, is killed and reaped (no zombies) and never reused.

**A turn.** The model's response is searched for fenced code blocks whose language tag is
``python``, ``py`` or ``python3`` (case-insensitive; a fence without a tag, or of another
language, is prose). All closed blocks are joined, in order, with a blank line and run as *one*
``world.execute`` call (one AppWorld interaction); an unclosed fence (e.g. a response cut at the
token budget) is not run. No block: nothing runs and the observation is :data:`NO_CODE_MESSAGE`.
The observation is the execution's output, cut to ``max_observation_chars`` characters (the head
is kept, followed by a note of how many characters were cut).

**End of an episode.** After each execution the server checks ``world.task_completed()`` (the
model called ``apis.supervisor.complete_task(...)``); the episode also ends after ``max_steps``
turns (the paper: 10; an episode the agent loop stops first — its ``max_turns``, the context
limit — is evaluated as it stands by :meth:`AppWorldEnv.truncate`), when the same code (whitespace-
normalised, "" when there is none) comes ``repetition_limit`` turns in a row (0: never), or when
the server fails (died, or no answer within its time limit). Rewards are 0 on every other turn.

**Reward** (``reward`` option), on the episode's last turn, from ``world.evaluate()`` (the task's
unit tests; ``fraction = passed / total``):

* ``"fraction"`` (default): ``fraction``.
* ``"success"``: 1 if every test passed, else 0.
* ``"paper"``: the shaping of the paper's reference code — 1.5 on success, ``0.5 * fraction``
  otherwise, and -1 when the repetition detector fires (the reference's exact detector is not
  published; here it is the ``repetition_limit`` rule above, and the task is not evaluated).

A server failure ends the episode with reward 0 and ``info["error"]``. ``info`` always has
``turn``, ``executed``, ``completed``; the last turn adds ``outcome`` (``"completed"``,
``"max_steps"``, ``"repetition"`` or ``"server_error"``), ``success``, ``passed``, ``total`` and
``fraction`` (when evaluated).

**Tasks.** Task ids of a split come from AppWorld's ``load_task_ids(split)`` (the paper: ``train``,
90 tasks, and ``dev``, 57), which needs AppWorld's data bundle (``appworld download data``, from
S3); without it :class:`AppWorldDataMissing` says so. ``task_ids`` in the options skips that
look-up.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from seeupo.llm.agent import Message, StepResult
from seeupo.llm.envs import EnvSpec, register_env

SERVER_SCRIPT = Path(__file__).with_name("appworld_server.py")
PYTHON_ENV_VAR = "SEEUPO_APPWORLD_PYTHON"
DATA_HINT = "AppWorld data bundle not installed: run `appworld download data` where S3 is reachable"
NO_CODE_MESSAGE = ("No code was run: your reply had no ```python code block. Think briefly, then write your "
                   "next step as one ```python block (call apis.supervisor.complete_task() when the task is done).")


# --------------------------------------------------------------------------- errors


class AppWorldError(RuntimeError):
    """The server answered ``{"ok": false, "error": ...}`` (the message is that one line)."""


class AppWorldDataMissing(AppWorldError):
    """AppWorld's data bundle is not where the server looks (``$APPWORLD_ROOT/data``)."""


class ServerFailure(RuntimeError):
    """The server process died, answered garbage, or did not answer in time (it has been killed)."""


class ServerTimeout(ServerFailure):
    """No answer within the time limit; the process was killed."""


# --------------------------------------------------------------------------- one server process


def default_python() -> str:
    python = os.environ.get(PYTHON_ENV_VAR)
    if not python:
        raise AppWorldError(f"no AppWorld interpreter: set options.python or {PYTHON_ENV_VAR} to the python of an "
                            "environment with appworld installed (`make appworld-env` makes .venv-appworld)")
    return python


def _reap(proc: subprocess.Popen, stderr: Any) -> None:
    """Shut ``proc`` down (ask, then kill) and wait for it, so that it leaves no zombie."""
    if proc.poll() is None:
        try:
            proc.stdin.write('{"op": "shutdown"}\n')
            proc.stdin.flush()
        except (OSError, ValueError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout, stderr):
        try:
            stream.close()
        except (OSError, ValueError):
            pass


class AppWorldServer:
    """One ``appworld_server.py`` process: :meth:`request` sends one op and waits for its reply.

    Its stderr (AppWorld's prints and tracebacks) goes to a temporary file; the last lines of it
    are quoted when the process dies. ``script`` is for tests only (a scripted fake server).
    """

    def __init__(self, python: str | None = None, *, root: str | None = None, start_timeout: float = 120.0,
                 script: str | os.PathLike | None = None, wait: bool = True) -> None:
        python = python or default_python()
        if os.sep in python:  # the child runs in ``root``: relative paths would point elsewhere there
            python = os.path.abspath(python)
        env = dict(os.environ)
        if root is not None:
            root = os.path.abspath(root)
            env["APPWORLD_ROOT"] = root
        # stderr: an unlinked temporary file the child appends to and we read through our own handle
        fd, path = tempfile.mkstemp(prefix="seeupo-appworld-", suffix=".log")
        os.close(fd)
        child_err = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._stderr = open(path, encoding="utf-8", errors="replace")
        os.unlink(path)
        try:
            self.proc = subprocess.Popen(
                [python, "-u", os.path.abspath(script or SERVER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=child_err, text=True, encoding="utf-8", bufsize=1, env=env,
                cwd=root if root is not None else None)
        except OSError as err:
            self._stderr.close()
            raise AppWorldError(f"cannot start the AppWorld server with {python!r}: {err}") from None
        finally:
            os.close(child_err)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._finalizer = weakref.finalize(self, _reap, self.proc, self._stderr)
        self.start_timeout = start_timeout
        self.info: dict = {}
        if wait:
            self.wait_ready()

    def wait_ready(self) -> dict:
        """Wait for the ``ping`` reply (the process has imported appworld); ``wait=False`` defers this."""
        if not self.info:
            self.info = self.request("ping", timeout=self.start_timeout)
        return self.info

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                self._lines.put(line)
        except (OSError, ValueError):  # the pipe was closed by kill()
            pass
        self._lines.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, lines: int = 3) -> str:
        try:
            self._stderr.seek(0)
            tail = [line.strip() for line in self._stderr.read().splitlines() if line.strip()][-lines:]
        except (OSError, ValueError):
            return ""
        return " | ".join(tail)

    def request(self, op: str, timeout: float, **fields: Any) -> dict:
        """Send ``{"op": op, **fields}``; the reply (``ok`` true) or :class:`AppWorldError` / :class:`ServerFailure`."""
        if not self.alive():
            self.kill()
            raise ServerFailure(f"the AppWorld server (pid {self.pid}) is not running (exit code {self.proc.returncode})")
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self._died(op)
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise ServerTimeout(f"the AppWorld server gave no answer to {op!r} within {timeout:g} s; "
                                f"it was killed") from None
        if line is None:
            self._died(op)
        try:
            reply = json.loads(line)
            assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
        except (ValueError, AssertionError):
            self.kill()
            raise ServerFailure(f"the AppWorld server answered {op!r} with a line that is not a reply: "
                                f"{line[:200]!r}; it was killed") from None
        if not reply["ok"]:
            error = str(reply.get("error", "unknown error"))
            raise (AppWorldDataMissing if "data bundle not installed" in error else AppWorldError)(error)
        return reply

    def _died(self, op: str) -> None:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        tail = self.stderr_tail()
        self.kill()
        raise ServerFailure(f"the AppWorld server (pid {self.pid}) exited with code {code} during {op!r}"
                            + (f": {tail}" if tail else ""))

    def kill(self) -> None:
        """Stop the process now and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._finalizer()

    def shutdown(self) -> None:
        """Ask the process to exit (killing it after 5 s) and reap it."""
        self._finalizer()


def _shutdown_all(servers: list[AppWorldServer]) -> None:
    for server in servers:
        server.shutdown()


class ServerPool:
    """Idle :class:`AppWorldServer` processes, reused across episodes (at most ``max_idle`` kept)."""

    def __init__(self, python: str | None = None, *, root: str | None = None, max_idle: int = 8,
                 start_timeout: float = 120.0, close_timeout: float = 60.0, script: str | None = None) -> None:
        self.python, self.root, self.max_idle = python or default_python(), root, max_idle
        self.start_timeout, self.close_timeout, self.script = start_timeout, close_timeout, script
        self._idle: list[AppWorldServer] = []
        self._lock = threading.Lock()
        weakref.finalize(self, _shutdown_all, self._idle)  # at interpreter exit, or when the pool is dropped

    def acquire(self) -> AppWorldServer:
        with self._lock:
            while self._idle:
                server = self._idle.pop()
                if server.alive():
                    return server
                server.kill()
        return AppWorldServer(self.python, root=self.root, start_timeout=self.start_timeout, script=self.script)

    def prestart(self, n: int) -> int:
        """Start ``n`` processes at once (their imports overlap) and keep them idle (at most
        ``max_idle`` in all); how many were added. A process that fails to start raises."""
        n = max(0, min(n, self.max_idle - len(self._idle)))
        servers = [AppWorldServer(self.python, root=self.root, start_timeout=self.start_timeout, script=self.script,
                                  wait=False) for _ in range(n)]
        try:
            for server in servers:
                server.wait_ready()
        except (AppWorldError, ServerFailure):
            for server in servers:
                server.kill()
            raise
        with self._lock:
            self._idle.extend(servers)
        return n

    def release(self, server: AppWorldServer, delete_outputs: bool = True) -> None:
        """Close the server's world and keep the process for the next episode (or shut it down)."""
        if not server.alive():
            server.kill()
            return
        try:
            server.request("close", timeout=self.close_timeout, delete_outputs=delete_outputs)
        except (AppWorldError, ServerFailure):
            server.kill()
            return
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(server)
                return
        server.shutdown()

    def close(self) -> None:
        """Shut every idle process down."""
        with self._lock:
            idle = self._idle[:]
            self._idle.clear()
        _shutdown_all(idle)

    def __enter__(self) -> "ServerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------- options


@dataclass
class AppWorldOptions:
    """``env.options`` of AppWorld (``env.name: appworld``).

    python: the interpreter of an environment with ``appworld`` installed (default: ``$SEEUPO_APPWORLD_PYTHON``).
    root: the AppWorld root (the folder holding ``data/``; experiment outputs go under it) given
      to the server as ``APPWORLD_ROOT`` and as its working directory (default: inherited).
    split: the training split (``train``: 90 tasks, ``dev``: 57); ``task_ids`` replaces it.
    max_steps: turns per episode (the paper: 10).
    reward, repetition_limit: see the module's docstring.
    max_observation_chars: an execution output longer than this is cut (head kept).
    api_docs: how the first message lists the task's apps: ``names`` (each app's description and
      API names; all 11 apps: about 9,700 characters), ``descriptions`` (each API with its one-line
      description; about 32,000) or ``none``.
    execute_timeout: AppWorld's own time limit on one execution (seconds; it reports a timeout as
      the output); ``kill_grace`` more seconds without an answer and the process is killed.
    reset_timeout, evaluate_timeout, start_timeout: seconds to wait for those replies.
    pool_size: idle server processes kept for reuse between episodes. A step runs
      ``tasks_per_step x group_size`` episodes at once (the paper: 32 x 8 = 256), each holding a
      process; keeping them all idle between steps spares that many restarts (about 3 CPU
      seconds each) at about 125 MB of memory per idle process.
    prestart: processes started in parallel before training (``EnvSpec.prepare``), so that the
      first step does not start them one at a time (0: none; at most ``pool_size``).
    experiment_name: prefix of AppWorld's experiment names (each episode gets a unique one, so
      that rollouts of the same task never share an output folder).
    keep_outputs: keep AppWorld's per-episode output folders (databases, logs) under ``root``.
    max_new_tokens: per-turn token budget (``None``: the config's).
    """

    python: str | None = None
    root: str | None = None
    split: str = "train"
    task_ids: tuple[str, ...] | None = None
    max_steps: int = 10
    reward: Literal["fraction", "success", "paper"] = "fraction"
    repetition_limit: int = 3
    max_observation_chars: int = 4000
    api_docs: Literal["names", "descriptions", "none"] = "names"
    execute_timeout: int = 60
    kill_grace: float = 30.0
    reset_timeout: float = 300.0
    evaluate_timeout: float = 300.0
    start_timeout: float = 120.0
    pool_size: int = 256
    prestart: int = 0
    experiment_name: str = "seeupo"
    keep_outputs: bool = False
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.experiment_name) or set(self.experiment_name) == {"."}:
            raise ValueError("experiment_name must be letters, digits, '_', '-' or '.'")
        if self.task_ids is not None and not self.task_ids:
            raise ValueError("task_ids must not be empty")


APPWORLD_BOUNDS = {"max_steps": (1, 100), "repetition_limit": (0, 100), "max_observation_chars": (100, 1_000_000),
                   "execute_timeout": (1, 3600), "kill_grace": (1.0, 3600.0), "reset_timeout": (1.0, 3600.0),
                   "evaluate_timeout": (1.0, 3600.0), "start_timeout": (1.0, 3600.0), "pool_size": (0, 4096), "prestart": (0, 4096),
                   "max_new_tokens": (1, 1_000_000)}


# --------------------------------------------------------------------------- text: prompt, code, observation

_FENCE = re.compile(r"```[ \t]*(python3?|py)[ \t]*\n(.*?)```", re.IGNORECASE | re.DOTALL)


def extract_code(text: str) -> str | None:
    """The code of a response: every closed ```python / ```py / ```python3 block, in order, joined
    by a blank line; ``None`` when there is none (other fences, unclosed fences and prose are ignored)."""
    blocks = [m.group(2).strip("\n") for m in _FENCE.finditer(text)]
    blocks = [b for b in blocks if b.strip()]
    return "\n\n".join(blocks) if blocks else None


def normalize_code(code: str | None) -> str:
    """``code`` with whitespace runs collapsed and blank lines dropped (for the repetition rule)."""
    return "\n".join(" ".join(line.split()) for line in (code or "").splitlines() if line.strip())


def truncate(text: str, limit: int) -> str:
    """``text`` if at most ``limit`` characters, else its head and a note of how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... output truncated: {len(text) - limit} more characters]"


SYSTEM_PROMPT = """\
You are an autonomous assistant. You complete your supervisor's day-to-day tasks on their behalf by \
operating apps (for example spotify, venmo, gmail) through their Python APIs, in a Python REPL, over \
several turns.

Every turn: first reason briefly (a few sentences) about what to do next, then write one ```python \
code block. The environment runs it and answers with what it printed; use print(...) to see results. \
Variables persist between turns. Work in small steps and check the output before going on.

* Call an API as apis.<app_name>.<api_name>(...).
* List an app's APIs: print(apis.api_docs.show_api_descriptions(app_name='spotify'))
* Read an API's parameters and response: print(apis.api_docs.show_api_doc(app_name='spotify', api_name='login'))
* Account passwords are in the supervisor app: print(apis.supervisor.show_account_passwords())
* Never make up values: look them up through the APIs. Results are often paginated: go through every page.
* When the task is done, call apis.supervisor.complete_task(); if the task asks for an answer, pass it: \
apis.supervisor.complete_task(answer=...).

You have at most {max_steps} turns."""


def api_summary(api_docs: dict[str, dict], mode: str) -> str:
    """The apps of a task as the first message lists them (``mode``: see :class:`AppWorldOptions`)."""
    if mode == "none" or not api_docs:
        return ""
    lines = ["Apps you can use:"]
    for app, doc in api_docs.items():
        lines.append(f"- {app}: {doc.get('description', '')}".rstrip())
        apis = doc.get("apis", {})
        if mode == "names":
            lines.append(f"  APIs: {', '.join(apis)}")
        else:
            lines.extend(f"  - {api}: {text}".rstrip() for api, text in apis.items())
    return "\n".join(lines)


def initial_messages(instruction: str, supervisor: dict, api_docs: dict[str, dict], *, max_steps: int,
                     api_docs_mode: str = "names") -> list[Message]:
    """The system prompt (ReAct with short reasoning) and the task message."""
    name = " ".join(str(supervisor.get(k, "")) for k in ("first_name", "last_name")).strip()
    who = [f"My name is {name}." if name else ""]
    if supervisor.get("email"):
        who.append(f"My personal email is {supervisor['email']}.")
    if supervisor.get("phone_number"):
        who.append(f"My phone number is {supervisor['phone_number']}.")
    parts = [" ".join(w for w in who if w), f"Task: {instruction}", api_summary(api_docs, api_docs_mode)]
    return [{"role": "system", "content": SYSTEM_PROMPT.format(max_steps=max_steps)},
            {"role": "user", "content": "\n\n".join(p for p in parts if p)}]


def shaped_reward(mode: str, success: bool, fraction: float) -> float:
    if mode == "success":
        return float(success)
    if mode == "paper":
        return 1.5 if success else 0.5 * fraction
    return fraction


# --------------------------------------------------------------------------- the environment

_episode_numbers = itertools.count()


class AppWorldEnv:
    """One AppWorld episode at a time; ``reset(task_id)`` takes a task id (a string).

    A context manager: leaving it (or :meth:`close`) gives the server process back to the pool.
    """

    def __init__(self, options: AppWorldOptions | None = None, pool: ServerPool | None = None) -> None:
        self.options = options or AppWorldOptions()
        o = self.options
        self._own_pool = pool is None
        self.pool = pool or ServerPool(o.python, root=o.root, max_idle=o.pool_size, start_timeout=o.start_timeout)
        self.server: AppWorldServer | None = None
        self._release: weakref.finalize | None = None
        self.task_id: str | None = None
        self.turn = 0
        self.done = True
        self._last_code: str | None = None
        self._repeats = 0

    # -- server handling
    def _take_server(self) -> AppWorldServer:
        if self.server is None:
            self.server = self.pool.acquire()
            self._release = weakref.finalize(self, self.pool.release, self.server, not self.options.keep_outputs)
        return self.server

    def _give_back(self) -> None:
        if self._release is not None:
            self._release()  # pool.release(server): close the world, keep or stop the process
        self.server, self._release = None, None

    def close(self) -> None:
        """End the episode (if any) and give the server back; an own pool is shut down too."""
        self.done = True
        self._give_back()
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> "AppWorldEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the Environment protocol
    def reset(self, task: Any) -> list[Message]:
        if not isinstance(task, str):
            raise TypeError(f"an AppWorld task is a task id string, got {type(task).__name__}")
        o = self.options
        self._give_back()
        name = f"{o.experiment_name}_{os.getpid()}_{next(_episode_numbers)}"
        for attempt in range(2):  # a process that died while idle gets one replacement
            server = self._take_server()
            try:
                reply = server.request("reset", timeout=o.reset_timeout, task_id=task, experiment_name=name,
                                       timeout_seconds=o.execute_timeout)
                break
            except ServerFailure:
                self._give_back()
                if attempt == 1:
                    raise
            except AppWorldError:
                self._give_back()
                raise
        self.task_id, self.turn, self.done = task, 0, False
        self._last_code, self._repeats = None, 0
        return initial_messages(reply["instruction"], reply.get("supervisor", {}), reply.get("api_docs", {}),
                                max_steps=o.max_steps, api_docs_mode=o.api_docs)

    def step(self, assistant_text: str, token_ids: list[int]) -> StepResult:
        if self.done or self.server is None:
            raise RuntimeError("step() after the episode ended: call reset() first")
        o = self.options
        self.turn += 1
        info: dict[str, Any] = {"turn": self.turn - 1, "executed": False, "completed": False}
        code = extract_code(assistant_text)
        key = normalize_code(code)
        self._repeats = self._repeats + 1 if key == self._last_code else 1
        self._last_code = key
        try:
            if code is None:
                observation = NO_CODE_MESSAGE
            else:
                try:
                    reply = self.server.request("execute", timeout=o.execute_timeout + o.kill_grace, code=code)
                    observation, info["completed"] = str(reply["output"]), bool(reply["completed"])
                except AppWorldError as err:  # AppWorld raised outside the code's own sandbox
                    observation = f"Execution failed: {err}"
                info["executed"] = True
            if o.repetition_limit and self._repeats >= o.repetition_limit and not info["completed"]:
                return self._finish(info, "repetition")
            if info["completed"]:
                return self._finish(info, "completed")
            if self.turn >= o.max_steps:
                return self._finish(info, "max_steps")
        except ServerFailure as err:
            return self._fail(info, err)
        return StepResult(truncate(observation, o.max_observation_chars), 0.0, False, info)

    def truncate(self, outcome: str) -> StepResult | None:
        """The agent loop ended the episode (``max_turns`` or the context limit): evaluate it as it stands."""
        if self.done or self.server is None:
            return None
        try:
            return self._finish({"turn": self.turn}, outcome)
        except ServerFailure as err:
            return self._fail({"turn": self.turn}, err)

    def _finish(self, info: dict, outcome: str) -> StepResult:
        o = self.options
        info["outcome"] = outcome
        if outcome == "repetition" and o.reward == "paper":
            reward = -1.0
        else:
            try:
                result = self.server.request("evaluate", timeout=o.evaluate_timeout)
            except AppWorldError as err:
                return self._fail(info, err)
            passed, total = int(result["passed"]), int(result["total"])
            fraction = passed / total if total else float(bool(result["success"]))
            info.update(success=bool(result["success"]), passed=passed, total=total, fraction=fraction)
            reward = shaped_reward(o.reward, bool(result["success"]), fraction)
        self.done = True
        self._give_back()
        return StepResult(None, reward, True, info)

    def _fail(self, info: dict, err: Exception) -> StepResult:
        info.update(outcome="server_error", error=str(err))
        print(f"AppWorld task {self.task_id}: {err}", file=sys.stderr)
        self.done = True
        self._give_back()
        return StepResult(None, 0.0, True, info)


# --------------------------------------------------------------------------- the builder


def load_task_ids(split: str, pool: ServerPool, timeout: float = 300.0) -> list[str]:
    """AppWorld's ``load_task_ids(split)`` (needs the data bundle: :class:`AppWorldDataMissing` otherwise)."""
    server = pool.acquire()
    try:
        return list(server.request("task_ids", timeout=timeout, split=split)["task_ids"])
    except AppWorldDataMissing as err:
        raise AppWorldDataMissing(f"{DATA_HINT} ({err})") from None
    finally:
        pool.release(server)


@register_env("appworld", options=AppWorldOptions, bounds=APPWORLD_BOUNDS)
def make_appworld(opts: AppWorldOptions, tokenizer: Any, seed: int) -> EnvSpec:
    """AppWorld's :class:`~seeupo.llm.envs.EnvSpec` from ``env.options`` (see :class:`AppWorldOptions`)."""
    from seeupo.validation.errors import InputError

    try:  # no interpreter, or no data bundle: a set-up error of the user's, reported in one line
        pool = ServerPool(opts.python, root=opts.root, max_idle=opts.pool_size, start_timeout=opts.start_timeout)
        tasks = list(opts.task_ids) if opts.task_ids is not None else load_task_ids(opts.split, pool, opts.reset_timeout)
        # `seeupo eval` scores the dev split (paper: 57 tasks) unless task ids were given
        eval_tasks = tasks if opts.task_ids is not None else load_task_ids("dev", pool, opts.reset_timeout)
    except AppWorldError as err:
        raise InputError("config.env.options", str(err)) from None

    def prepare(policy: Any) -> dict[str, float]:
        if opts.prestart == 0:
            return {}
        start = time.monotonic()
        added = pool.prestart(opts.prestart)
        return {"appworld/prestarted": float(added), "appworld/prestart_s": time.monotonic() - start}

    return EnvSpec(tasks=tasks, make=lambda generator: AppWorldEnv(opts, pool), max_new_tokens=opts.max_new_tokens,
                   prepare=prepare, eval_tasks=eval_tasks)
