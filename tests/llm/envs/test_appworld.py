"""AppWorld: the real server process with the real ``appworld`` package, and our environment.

* Real process (``SEEUPO_APPWORLD_PYTHON``: the python of an environment with appworld 0.1.3.post1,
  ``make appworld-env``; skipped with the reason otherwise): ping, protocol errors, the missing-data
  error, stdout kept clean, a killed or stopped process, clean shutdown without zombies.
* Tasks need AppWorld's data bundle (``appworld download data``, S3 only): those tests skip with
  the reason when the real server reports no data.
* Episode logic (termination, rewards, truncation, repetition, failures) runs against the FAKE
  server ``fake_appworld_server.py`` (a scripted world, no appworld), in addition to the above.
* Code-block extraction and prompt building are plain unit tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seeupo.llm.envs import ENVIRONMENTS, make_environment
from seeupo.llm.envs.appworld import (
    NO_CODE_MESSAGE,
    SERVER_SCRIPT,
    AppWorldDataMissing,
    AppWorldEnv,
    AppWorldError,
    AppWorldOptions,
    AppWorldServer,
    ServerFailure,
    ServerPool,
    ServerTimeout,
    api_summary,
    extract_code,
    initial_messages,
    normalize_code,
    shaped_reward,
    truncate,
)
from seeupo.validation.errors import InputError

FAKE = str(Path(__file__).with_name("fake_appworld_server.py"))
DATA_SKIP = "AppWorld data bundle not installed: run `appworld download data` where S3 is reachable"


def _appworld_python() -> str:
    python = os.environ.get("SEEUPO_APPWORLD_PYTHON")
    if not python:
        pytest.skip("SEEUPO_APPWORLD_PYTHON is not set (`make test-appworld` sets it after `make appworld-env`)")
    if not Path(python).exists():
        pytest.skip(f"SEEUPO_APPWORLD_PYTHON={python} does not exist (run `make appworld-env`)")
    check = subprocess.run([python, "-c", "import appworld"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"appworld is not importable with {python}: {check.stderr.strip().splitlines()[-1:]}")
    return python


@pytest.fixture(scope="module")
def appworld_python():
    return _appworld_python()


@pytest.fixture
def empty_root(tmp_path):
    """An AppWorld root without data (what every machine without the S3 bundle has)."""
    root = tmp_path / "appworld_root"
    root.mkdir()
    return str(root)


@pytest.fixture
def real_server(appworld_python, empty_root):
    """A real server of its own (for the tests that kill or stop it)."""
    server = AppWorldServer(appworld_python, root=empty_root)
    yield server
    server.kill()


@pytest.fixture(scope="module")
def shared_server(appworld_python, tmp_path_factory):
    """One real server for the tests that leave it running (a start costs seconds)."""
    root = tmp_path_factory.mktemp("shared_root")
    server = AppWorldServer(appworld_python, root=str(root))
    yield server, str(root)
    server.kill()


def _gone(pid: int) -> bool:
    """The process is neither running nor a zombie (it was reaped)."""
    return not Path(f"/proc/{pid}").exists()


# --------------------------------------------------------------------------- the real server process


def test_ping_reports_the_real_package(shared_server):
    real_server, empty_root = shared_server
    info = real_server.info
    assert info["server"] == "seeupo-appworld" and info["protocol"] == 1
    assert info["appworld"] == "0.1.3.post1"
    assert info["pydantic"].startswith("1.")  # why it needs its own environment
    assert info["appworld_root"] == empty_root and info["data_installed"] is False
    assert real_server.request("ping", timeout=30)["pid"] == real_server.pid


def test_raw_protocol_errors_are_one_line_and_stdout_stays_json(appworld_python, empty_root):
    requests = ["not json", "[1, 2]", '{"op": "nope"}', '{"op": "__init__"}', '{"op": "reset"}',
                '{"op": "reset", "task_id": "x", "timeout_seconds": 0}', '{"op": "execute", "code": "print(1)"}',
                '{"op": "execute"}', '{"op": "evaluate"}', '{"op": "close"}', '{"op": "ping"}', '{"op": "shutdown"}']
    env = dict(os.environ, APPWORLD_ROOT=empty_root)
    done = subprocess.run([appworld_python, str(SERVER_SCRIPT)], input="\n".join(requests) + "\n",
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == len(requests)  # one reply per request, nothing else on stdout
    replies = [json.loads(line) for line in lines]
    errors = [r["error"] for r in replies if not r["ok"]]
    assert [r["ok"] for r in replies] == [False] * 9 + [True] * 3
    assert all("\n" not in e and "Traceback" not in e for e in errors)
    assert errors[0].startswith("bad JSON request")
    assert errors[1] == "a request must be a JSON object"
    assert errors[2].startswith("unknown op 'nope'") and errors[3].startswith("unknown op '__init__'")
    assert "task_id" in errors[4] and "timeout_seconds" in errors[5]
    assert errors[6] == "no task is open: send a reset first"
    assert "'code' must be a string" == errors[7]
    assert errors[8] == "no task is open: send a reset first"


# what the server reads from AppWorld, checked against the installed package (no data needed)
API_CONTRACT = r"""
import inspect, json
from appworld import AppWorld, load_task_ids
from appworld.evaluator import TestTracker
from appworld.task import Task
from appworld.common.path_store import path_store
params = inspect.signature(AppWorld.__init__).parameters
task_init = inspect.signature(Task.__init__).parameters
print(json.dumps({
    "init": [p for p in ("task_id", "experiment_name", "timeout_seconds") if p in params],
    "methods": [m for m in ("execute", "task_completed", "evaluate", "close") if callable(getattr(AppWorld, m, None))],
    "tracker": [p for p in ("success", "pass_count", "num_tests") if isinstance(getattr(TestTracker, p, None), property)],
    "task": [p for p in ("instruction", "supervisor", "allowed_apps") if p in task_init],
    "load_task_ids": list(inspect.signature(load_task_ids).parameters)[:1],
    "paths": [p for p in ("data", "experiment_outputs") if isinstance(getattr(type(path_store), p, None), property)],
}))
"""


def test_the_appworld_api_the_server_uses(appworld_python):
    done = subprocess.run([appworld_python, "-c", API_CONTRACT], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(appworld_python))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "init": ["task_id", "experiment_name", "timeout_seconds"],
        "methods": ["execute", "task_completed", "evaluate", "close"],
        "tracker": ["success", "pass_count", "num_tests"],
        "task": ["instruction", "supervisor", "allowed_apps"],
        "load_task_ids": ["dataset_name"],
        "paths": ["data", "experiment_outputs"]}


# the server's API-docs summary of the real apps: AppWorld builds the docs from the app code that
# `appworld install` unpacked (a task's own docs come from the data bundle, but list the same APIs)
REAL_DOCS = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("appworld_server", sys.argv[1])
server = importlib.util.module_from_spec(spec); spec.loader.exec_module(server)
from appworld.apps import APP_TO_DESCRIPTION, get_all_apps
from appworld.collections.api_docs import ApiDocCollection
apps = tuple(get_all_apps(skip_admin=True))
docs = ApiDocCollection.build(load_apps=apps, include_response_schemas=False)
print(json.dumps(server.summarize_api_docs(docs, APP_TO_DESCRIPTION, apps)))
"""


def test_prompt_with_the_real_api_docs(appworld_python):
    done = subprocess.run([appworld_python, "-c", REAL_DOCS, str(SERVER_SCRIPT)], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(appworld_python))
    assert done.returncode == 0, done.stderr[-2000:]
    docs = json.loads(done.stdout.splitlines()[-1])
    assert list(docs)[:2] == ["api_docs", "supervisor"] and {"spotify", "venmo", "gmail"} <= set(docs)
    assert {"complete_task", "show_account_passwords"} <= set(docs["supervisor"]["apis"])
    assert {"show_api_doc", "show_api_descriptions"} <= set(docs["api_docs"]["apis"])
    assert all(doc["description"] for doc in docs.values())
    names = initial_messages("Play a song.", {"first_name": "A"}, docs, max_steps=10)[1]["content"]
    full = initial_messages("Play a song.", {"first_name": "A"}, docs, max_steps=10, api_docs_mode="descriptions")
    assert "- spotify: A music streaming app" in names and "login" in names
    # sizes in characters (about 4 per token): the "names" summary is the default for a reason
    assert len(names) < 15_000 < len(full[1]["content"]), (len(names), len(full[1]["content"]))


NOISY_SERVER = r"""
import os, runpy, sys
ns = runpy.run_path(sys.argv[1])
ping = ns["Server"].op_ping
def noisy_ping(self, request):
    print("noise from print")
    os.write(1, b"noise on fd 1\n")
    return ping(self, request)
ns["Server"].op_ping = noisy_ping
ns["main"]()
"""


def test_stray_output_goes_to_stderr(appworld_python, empty_root):
    env = dict(os.environ, APPWORLD_ROOT=empty_root)
    done = subprocess.run([appworld_python, "-c", NOISY_SERVER, str(SERVER_SCRIPT)], input='{"op": "ping"}\n',
                          capture_output=True, text=True, env=env, cwd=empty_root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["ok"] for line in done.stdout.splitlines()] == [True]
    assert "noise from print" in done.stderr and "noise on fd 1" in done.stderr


def test_reset_without_data_is_a_clean_error(shared_server):
    real_server, empty_root = shared_server
    with pytest.raises(AppWorldDataMissing) as err:
        real_server.request("reset", timeout=60, task_id="50e1ac9_1", experiment_name="t")
    message = str(err.value)
    assert "AppWorld data bundle not installed" in message and "appworld download data" in message
    assert os.path.join(empty_root, "data") in message and "\n" not in message
    with pytest.raises(AppWorldDataMissing):
        real_server.request("task_ids", timeout=60, split="train")
    assert real_server.alive()  # errors do not take the process down


def test_env_and_builder_without_data(appworld_python, empty_root):
    opts = AppWorldOptions(python=appworld_python, root=empty_root)
    with AppWorldEnv(opts) as env, pytest.raises(AppWorldDataMissing, match="data bundle not installed"):
        env.reset("50e1ac9_1")
    with pytest.raises(InputError, match="run `appworld download data` where S3 is reachable"):
        make_environment("appworld", {"python": appworld_python, "root": empty_root, "split": "dev"}, None, 0)


def test_killed_process_is_reported_and_reaped(real_server):
    pid = real_server.pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(ServerFailure, match="not running|exited"):
        real_server.request("ping", timeout=30)
    assert _gone(pid)


def test_a_hung_process_times_out_and_is_killed(real_server):
    pid = real_server.pid
    os.kill(pid, signal.SIGSTOP)  # the process stops answering
    start = time.monotonic()
    with pytest.raises(ServerTimeout, match="no answer to 'ping' within 1 s"):
        real_server.request("ping", timeout=1)
    assert time.monotonic() - start < 10
    assert not real_server.alive() and _gone(pid)
    with pytest.raises(ServerFailure):
        real_server.request("ping", timeout=1)


def test_pool_replaces_a_dead_process_and_shuts_down_cleanly(appworld_python, empty_root):
    pool = ServerPool(appworld_python, root=empty_root, max_idle=1)
    first = pool.acquire()
    pool.release(first)  # close on an empty world is fine; the process is kept
    assert first.alive() and pool.acquire() is first
    pool.release(first)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait()
    second = pool.acquire()  # the dead idle one is dropped
    assert second is not first and second.alive()
    pool.release(second)
    pool.close()
    assert _gone(first.pid) and _gone(second.pid)


def test_prestart_real_processes(appworld_python, empty_root):
    with ServerPool(appworld_python, root=empty_root, max_idle=3) as pool:
        start = time.monotonic()
        assert pool.prestart(3) == 3
        elapsed = time.monotonic() - start
        servers = list(pool._idle)
        assert all(s.alive() and s.info["appworld"] == "0.1.3.post1" for s in servers)
        print(f"3 AppWorld servers started in parallel in {elapsed:.1f} s")
    assert all(_gone(s.pid) for s in servers)


def test_env_reset_survives_a_process_that_died_while_idle(appworld_python, empty_root):
    pool = ServerPool(appworld_python, root=empty_root, max_idle=2)
    server = pool.acquire()
    pool.release(server)
    os.kill(server.pid, signal.SIGKILL)
    env = AppWorldEnv(AppWorldOptions(python=appworld_python, root=empty_root), pool)
    with pytest.raises(AppWorldDataMissing):  # a fresh process answered, so the error is the data one
        env.reset("50e1ac9_1")
    env.close()
    pool.close()
    assert _gone(server.pid)


def test_server_exits_at_end_of_input_and_at_interpreter_exit(appworld_python, empty_root, tmp_path):
    # a seeupo process that exits with a server in its pool (and one in use) leaves no process behind
    script = tmp_path / "child.py"
    script.write_text(
        "from seeupo.llm.envs.appworld import ServerPool\n"
        f"pool = ServerPool({appworld_python!r}, root={empty_root!r})\n"
        "a, b = pool.acquire(), pool.acquire()\n"
        "pool.release(a)\n"
        "print(a.pid, b.pid)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    time.sleep(0.5)
    assert all(_gone(p) for p in pids)


def _not_running(pid: int) -> bool:
    """Exited: reaped, or a zombie left to whichever process adopted it (not ours to reap)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" in status


def test_server_exits_when_seeupo_is_killed(appworld_python, empty_root, tmp_path):
    # no atexit, no finalizers: the server sees the end of its input and exits by itself
    script = tmp_path / "child.py"
    script.write_text(
        "import os, sys\n"
        "from seeupo.llm.envs.appworld import AppWorldServer\n"
        f"server = AppWorldServer({appworld_python!r}, root={empty_root!r})\n"
        "print(server.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == -9
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while not _not_running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _not_running(pid)


def test_a_python_without_appworld_fails_at_start(empty_root):
    with pytest.raises(ServerFailure, match="No module named 'appworld'|ModuleNotFoundError"):
        AppWorldServer(sys.executable, root=empty_root)


def test_no_python_configured(monkeypatch):
    monkeypatch.delenv("SEEUPO_APPWORLD_PYTHON", raising=False)
    with pytest.raises(AppWorldError, match="SEEUPO_APPWORLD_PYTHON"):
        ServerPool()


# --------------------------------------------------------------------------- with the data bundle


@pytest.fixture(scope="module")
def data_root(appworld_python):
    root = os.environ.get("APPWORLD_ROOT")
    server = AppWorldServer(appworld_python, root=root)
    try:
        installed = server.info["data_installed"]
    finally:
        server.kill()
    if not installed:
        pytest.skip(DATA_SKIP)
    return root


def test_real_splits_have_the_papers_sizes(appworld_python, data_root):
    pool = ServerPool(appworld_python, root=data_root)
    spec = make_environment("appworld", {"python": appworld_python, "root": data_root, "split": "train"}, None, 0)
    assert len(spec.tasks) == 90
    spec = make_environment("appworld", {"python": appworld_python, "root": data_root, "split": "dev"}, None, 0)
    assert len(spec.tasks) == 57
    pool.close()


def test_real_episode(appworld_python, data_root):
    opts = AppWorldOptions(python=appworld_python, root=data_root, max_steps=3)
    spec = make_environment("appworld", {"python": appworld_python, "root": data_root, "max_steps": 3}, None, 0)
    with AppWorldEnv(opts) as env:
        messages = env.reset(spec.tasks[0])
        assert "Task:" in messages[1]["content"] and "supervisor" in messages[1]["content"]
        result = env.step("```python\nprint(apis.api_docs.show_app_descriptions())\n```", [])
        assert not result.done and "supervisor" in result.observation
        result = env.step("```python\napis.supervisor.complete_task()\n```", [])
        assert result.done and result.info["outcome"] == "completed"
        assert result.info["total"] > 0 and 0.0 <= result.reward <= 1.0


# --------------------------------------------------------------------------- unit tests (no server)


def test_extract_code():
    assert extract_code("no code") is None
    assert extract_code("```\nprint(1)\n```") is None  # no language tag: prose
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("Think.\n```python\nx = 1\n```") == "x = 1"
    assert extract_code("```Python\nx = 1\n```\nthen\n```py\nprint(x)\n```") == "x = 1\n\nprint(x)"
    assert extract_code("```python3\n  a = 1\n```") == "  a = 1"
    assert extract_code("```python\nx = 1\n```\n```python\nprint(2") == "x = 1"  # unclosed: not run
    assert extract_code("```python\nprint(2") is None
    assert extract_code("```python\n\n```") is None  # empty block
    assert extract_code("```python\nprint('```')\n```") == "print('"  # a fence ends at the next ```


def test_normalize_truncate_reward():
    assert normalize_code("x  =  1\n\n  print(x) \n") == normalize_code("x = 1\nprint(x)")
    assert normalize_code(None) == ""
    assert truncate("abc", 3) == "abc"
    cut = truncate("a" * 10, 4)
    assert cut.startswith("aaaa\n") and "6 more characters" in cut
    assert shaped_reward("fraction", False, 0.5) == 0.5
    assert shaped_reward("success", True, 1.0) == 1.0 and shaped_reward("success", False, 0.9) == 0.0
    assert shaped_reward("paper", True, 1.0) == 1.5 and shaped_reward("paper", False, 0.5) == 0.25


def test_prompt():
    docs = {"supervisor": {"description": "The supervisor app.", "apis": {"complete_task": "Done.", "show_profile": "P."}},
            "spotify": {"description": "Music.", "apis": {"login": "Log in."}}}
    messages = initial_messages("Play a song.", {"first_name": "Ada", "last_name": "L", "email": "a@b.c"}, docs,
                                max_steps=10)
    assert [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    assert "```python" in system and "complete_task" in system and "at most 10 turns" in system
    assert "reason briefly" in system
    assert user.startswith("My name is Ada L. My personal email is a@b.c.")
    assert "Task: Play a song." in user and "- spotify: Music.\n  APIs: login" in user
    assert "APIs: complete_task, show_profile" in user
    assert "  - complete_task: Done." in api_summary(docs, "descriptions")
    assert api_summary(docs, "none") == ""
    no_docs = initial_messages("T", {}, docs, max_steps=3, api_docs_mode="none")[1]["content"]
    assert no_docs == "Task: T"


def test_options_validation():
    assert "appworld" in ENVIRONMENTS
    with pytest.raises(InputError, match="max_steps"):
        make_environment("appworld", {"max_steps": 0, "task_ids": ["a"], "python": FAKE}, None, 0)
    with pytest.raises(InputError, match="reward"):
        make_environment("appworld", {"reward": "nope", "task_ids": ["a"]}, None, 0)
    with pytest.raises(InputError, match="experiment_name"):
        make_environment("appworld", {"experiment_name": "../x", "task_ids": ["a"]}, None, 0)
    with pytest.raises(InputError, match="unknown|bogus"):
        make_environment("appworld", {"bogus": 1}, None, 0)


# --------------------------------------------------------------------------- episode logic (FAKE server)


@pytest.fixture
def fake_pool():
    pool = ServerPool(sys.executable, max_idle=2, script=FAKE)
    yield pool
    pool.close()


def fake_env(pool, **options) -> AppWorldEnv:
    return AppWorldEnv(AppWorldOptions(python=sys.executable, **options), pool)


def code(text: str) -> str:
    return f"Let me do it.\n```python\n{text}\n```"


def test_fake_episode_completes_with_fraction_reward(fake_pool):
    env = fake_env(fake_pool)
    messages = env.reset("fake_task")
    assert "Task: Play my favourite song." in messages[1]["content"]
    result = env.step(code("pass_test()"), [])
    assert (result.observation, result.reward, result.done) == ("ran: pass_test()", 0.0, False)
    assert result.info == {"turn": 0, "executed": True, "completed": False}
    result = env.step(code("pass_test(); apis.supervisor.complete_task()"), [])
    assert result.done and result.observation is None and result.reward == 0.5
    assert result.info["outcome"] == "completed" and (result.info["passed"], result.info["total"]) == (2, 4)
    assert env.server is None and len(fake_pool._idle) == 1  # process given back at the end
    with pytest.raises(RuntimeError, match="reset"):
        env.step(code("x"), [])


@pytest.mark.parametrize("mode,expected", [("fraction", 1.0), ("success", 1.0), ("paper", 1.5)])
def test_fake_success_rewards(fake_pool, mode, expected):
    env = fake_env(fake_pool, reward=mode)
    env.reset("fake_task")
    result = env.step(code("pass_test()\npass_test()\npass_test()\npass_test()\napis.supervisor.complete_task()"), [])
    assert result.done and result.info["success"] and result.reward == expected


def test_fake_max_steps_evaluates(fake_pool):
    env = fake_env(fake_pool, max_steps=3, reward="paper")
    env.reset("fake_task")
    rewards = [env.step(code(f"pass_test() # {k}"), []) for k in range(3)]
    assert [r.done for r in rewards] == [False, False, True]
    assert rewards[-1].info["outcome"] == "max_steps" and rewards[-1].reward == 0.5 * 3 / 4


def test_fake_no_code_and_repetition(fake_pool, tmp_path, monkeypatch):
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_APPWORLD_LOG", str(log))
    pool = ServerPool(sys.executable, script=FAKE)
    env = fake_env(pool, reward="paper", repetition_limit=3)
    env.reset("fake_task")
    first = env.step("I will think about it.", [])
    assert first.observation == NO_CODE_MESSAGE and first.info["executed"] is False and not first.done
    assert not env.step(code("x = 1"), []).done
    assert not env.step(code("x  =  1\n"), []).done  # the same code, twice in a row
    third = env.step(code("x = 1"), [])
    assert third.done and third.reward == -1.0 and third.info["outcome"] == "repetition"
    ops = [json.loads(line)["op"] for line in log.read_text().splitlines()]
    assert ops.count("execute") == 3 and "evaluate" not in ops  # no code: nothing sent; repetition: no evaluation
    env.reset("fake_task")  # fraction mode: repetition ends and evaluates
    env.options = AppWorldOptions(python=sys.executable, repetition_limit=2)
    env.step("no code", [])
    result = env.step("still no code", [])
    assert result.done and result.info["outcome"] == "repetition" and result.reward == 0.0 and "passed" in result.info
    pool.close()


def test_fake_observation_is_truncated(fake_pool):
    env = fake_env(fake_pool, max_observation_chars=100)
    env.reset("fake_task")
    result = env.step(code("big_output"), [])
    assert result.observation.startswith("x" * 100 + "\n[... output truncated: 9900 more characters]")


def test_fake_appworld_error_is_an_observation(fake_pool):
    env = fake_env(fake_pool)
    env.reset("fake_task")
    result = env.step(code("appworld_error"), [])
    assert not result.done and result.observation == "Execution failed: RuntimeError: something inside AppWorld broke"


def test_fake_crash_ends_the_episode(fake_pool):
    env = fake_env(fake_pool)
    env.reset("fake_task")
    pid = env.server.pid
    result = env.step(code("crash"), [])
    assert result.done and result.reward == 0.0 and result.info["outcome"] == "server_error"
    assert "exited with code 3" in result.info["error"] and _gone(pid)
    env.reset("fake_task")  # the next episode gets a new process
    assert env.server.pid != pid
    env.close()


def test_fake_hang_times_out(fake_pool):
    env = fake_env(fake_pool, execute_timeout=1, kill_grace=1.0)
    env.reset("fake_task")
    pid = env.server.pid
    start = time.monotonic()
    result = env.step(code("hang"), [])
    assert time.monotonic() - start < 10
    assert result.done and result.info["outcome"] == "server_error" and "within 2 s" in result.info["error"]
    assert _gone(pid)


def test_prestart_through_prepare():
    spec = make_environment("appworld", {"python": sys.executable, "task_ids": ["fake_task"], "pool_size": 3, "prestart": 5}, None, 0)
    pool = spec.make(None).pool
    pool.script = FAKE
    metrics = spec.prepare(None)
    assert metrics["appworld/prestarted"] == 3.0 and metrics["appworld/prestart_s"] > 0
    pids = [s.pid for s in pool._idle]
    assert len(set(pids)) == 3 and all(s.info["server"] == "fake-appworld" for s in pool._idle)
    env = spec.make(None)
    env.reset("fake_task")
    assert env.server.pid in pids  # an episode takes a started process
    env.close()
    pool.close()
    assert all(_gone(p) for p in pids)
    assert make_environment("appworld", {"python": sys.executable, "task_ids": ["a"]}, None, 0).prepare(None) == {}


def test_relative_paths_work_with_a_root(tmp_path):
    server = AppWorldServer(os.path.relpath(sys.executable), root=os.path.relpath(tmp_path),
                            script=os.path.relpath(FAKE))
    assert server.info["server"] == "fake-appworld"
    server.shutdown()
    assert _gone(server.pid)


def test_fake_unknown_task_and_bad_task_type(fake_pool):
    env = fake_env(fake_pool)
    with pytest.raises(AppWorldError, match="unknown AppWorld task id"):
        env.reset("other")
    with pytest.raises(TypeError):
        env.reset(3)
    env.close()


def test_fake_builder_and_env_lifecycle():
    spec = make_environment("appworld", {"python": sys.executable, "task_ids": ["fake_task"], "max_new_tokens": 256}, None, 0)
    assert spec.tasks == ["fake_task"] and spec.max_new_tokens == 256
    env = spec.make(None)
    env.pool.script = FAKE
    env.reset("fake_task")
    pid = env.server.pid
    del env  # dropped mid-episode: the process goes back to the pool
    import gc

    gc.collect()
    assert [s.pid for s in spec.make(None).pool._idle] == [pid]
    with fake_env(ServerPool(sys.executable, script=FAKE)) as env:
        env.reset("fake_task")
        pid = env.server.pid
    env.pool.close()
    assert _gone(pid)


class CodeEngine:
    """A scripted model: call ``k`` answers ``script[k]`` (then the end-of-turn token)."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, 0

    def generate(self, prompts, n, params):
        from seeupo.llm.rollout import Completion

        text = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [[Completion(list(ids), [-0.5] * len(ids), "stop") for _ in range(n)] for _ in prompts]

    def sync_weights(self, model):
        pass


def test_fake_server_through_the_agent_loop(tiny32):
    pytest.importorskip("transformers")
    from seeupo.llm.agent import AgentLimits, run_episodes
    from seeupo.llm.rollout import SamplingParams

    _, tokenizer = tiny32
    spec = make_environment("appworld", {"python": sys.executable, "task_ids": ["fake_task"], "pool_size": 4}, tokenizer, 0)
    pool = spec.make(None).pool
    pool.script = FAKE
    engine = CodeEngine(tokenizer, ["I need a test.\n```python\npass_test()\n```",
                                    "Now finish.\n```python\npass_test()\napis.supervisor.complete_task()\n```"])
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(tokenizer.eos_token_id,))
    out = run_episodes(engine, tokenizer, lambda: spec.make(None), spec.tasks, 3, params,
                       AgentLimits(max_turns=10, max_context=100_000))
    assert [(e.num_turns, e.traj_return, e.outcome) for e in out.episodes] == [(2, 0.5, "done")] * 3
    assert [t.observation for t in out.turns[:3]] == ["ran: pass_test()"] * 3
    assert all(t.info["outcome"] == "completed" and t.info["passed"] == 2 for t in out.turns[3:])
    assert len(pool._idle) == 3  # every episode gave its process back
    pool.close()


def test_fake_episode_the_loop_stops_is_evaluated_and_gives_its_process_back(fake_pool):
    env = fake_env(fake_pool, reward="fraction")
    env.reset("fake_task")
    env.step(code("pass_test()"), [])
    result = env.truncate("context")
    assert result.done and result.info["outcome"] == "context" and result.reward == 1 / 4
    assert env.server is None and len(fake_pool._idle) == 1
    assert env.truncate("max_turns") is None
