"""BFCL v4 multi-turn: the environment on bfcl-eval's backends and checker, gold replay of all 800 tasks.

Needs bfcl-eval (installed --no-deps by the Makefile); without it every test here is skipped
with the reason (``pytest -rs``).
"""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
import uuid

import pytest

from seeupo.llm.envs import bfcl, make_environment
from seeupo.llm.envs.toolcalls import ToolCall, ToolCallError, parse_python, validate

if not bfcl.bfcl_available():
    pytest.skip(bfcl.INSTALL_HINT, allow_module_level=True)

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402

# Ground truth the environment cannot accept, and why (benchmark data defects, not ours):
# * task 173 of every category: ``close_ticket(ticket_id='ticket_001')``, but the docs (and the
#   backend's signature) make ``ticket_id`` an integer, so the validator refuses the call;
# * miss_func_49: the ground truth calls ``tail`` in turn 1, but ``tail`` is held out until turn 3.
KNOWN_DEFECTS = {
    "multi_turn_base_173": "ticket_id' must be an integer",
    "multi_turn_miss_func_173": "ticket_id' must be an integer",
    "multi_turn_miss_param_173": "ticket_id' must be an integer",
    "multi_turn_long_context_173": "ticket_id' must be an integer",
    "multi_turn_miss_func_49": "unknown function 'tail'",
}


@pytest.fixture
def tokenizer(request):
    """The tiny Qwen3's tokenizer (skips without transformers)."""
    pytest.importorskip("transformers", reason="needs transformers and tokenizers (pip install -e '.[llm]')")
    return request.getfixturevalue("tiny32")[1]


def seeupo_keys() -> list[str]:
    return [k for k in vars(multi_turn_utils) if k.startswith("seeupo_")]


def all_docs(task: bfcl.BFCLTask) -> dict[str, dict]:
    docs = {d["name"]: d for d in task.entry["function"]}
    for held in (task.entry.get("missed_function") or {}).values():
        docs.update({d["name"]: d for d in held})
    return docs


def gold_text(task: bfcl.BFCLTask, calls: list[str], fmt: str) -> str:
    """The ground-truth calls of one turn written as a model would, in ``fmt``."""
    if fmt == "python":
        return "[" + ", ".join(calls) + "]"
    docs, blocks = all_docs(task), []
    for call in calls:
        (raw,) = parse_python(call)
        try:
            arguments = validate(raw, docs).arguments  # positional arguments get their names
        except ToolCallError:  # a ground-truth defect (KNOWN_DEFECTS): write it as it is
            arguments = raw.kwargs
        blocks.append("<tool_call>\n" + json.dumps({"name": raw.name, "arguments": arguments}) + "\n</tool_call>")
    return "\n".join(blocks)


def replay(task: bfcl.BFCLTask, fmt: str, options: bfcl.BFCLOptions | None = None):
    """Play the ground truth: each turn's calls in one response, then a response without calls."""
    env = bfcl.BFCLEnv(options or bfcl.BFCLOptions(max_steps=100))
    env.reset(task.id)
    errors, result = [], None
    for calls in task.ground_truth:
        if calls:
            result = env.step(gold_text(task, calls, fmt), [])
            if result.info.get("rejected"):
                errors.append(result.info["error"])
            if result.done:
                return result, errors
        result = env.step("Done.", [])
        if result.done:
            return result, errors
    raise AssertionError("the episode did not end")


# --------------------------------------------------------------------------- gold replay


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_gold_replay_scores_one_in_both_formats(category):
    """All 200 ground-truth episodes of the category, in JSON and in call syntax, through the
    parser, the validator, the executor and the official checker."""
    before = len(seeupo_keys())
    tasks = list(bfcl.load_category(category).values())
    assert len(tasks) == 200
    for fmt in ("python", "json"):
        failed = {}
        for task in tasks:
            result, errors = replay(task, fmt)
            assert result.done and result.observation is None
            if result.reward != 1.0 or errors:
                failed[task.id] = (result.info["error_type"], errors)
        assert sorted(failed) == sorted(k for k in KNOWN_DEFECTS if k.startswith(category + "_")), (fmt, failed)
        for task_id, (_, errors) in failed.items():
            assert any(KNOWN_DEFECTS[task_id] in e for e in errors), errors
    assert len(seeupo_keys()) == before  # nothing left behind in the executor's globals


def test_paper_budget_of_ten_steps_leaves_twelve_test_tasks_unsolvable():
    """At 10 responses, a task needs 2 responses per user turn with calls and 1 per turn without
    (the last turn's closing response is not needed): base test tasks needing more fail."""
    opts = bfcl.BFCLOptions(max_steps=10)
    test_ids = bfcl.split_tasks(("multi_turn_base",), "paper", "test")
    rewards = {t: replay(bfcl.get_task(t), "python", opts)[0] for t in test_ids}
    needs = {t: sum(2 if calls else 1 for calls in bfcl.get_task(t).ground_truth) - 1 for t in test_ids}
    too_long = {t for t in test_ids if needs[t] > 10}
    failed = {t for t, r in rewards.items() if r.reward != 1.0}
    assert failed == too_long | {"multi_turn_base_173"}  # 173: a ground-truth defect, see KNOWN_DEFECTS
    assert len(too_long) == 12
    for t in too_long:  # truncated before the last user turn, or out of steps within it
        info = rewards[t].info
        assert info["error_type"] == "multi_turn:force_terminated" if info["truncated"] else info["error_type"]


# --------------------------------------------------------------------------- prompts and turns


def test_reset_gives_the_official_prompting_system_prompt_and_first_user_message():
    env = bfcl.BFCLEnv()
    messages = env.reset("multi_turn_base_0")
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    assert system.startswith("You are an expert in composing functions.")
    assert "[func_name1(params_name1=params_value1" in system
    assert "Once you have no more functions to call, the system will consider the current turn complete" in system
    for doc in bfcl.get_task("multi_turn_base_0").entry["function"]:
        assert f'"name": "{doc["name"]}"' in system
    assert messages[1]["content"].startswith("Move 'final_report.pdf'")


def test_json_prompt_format_lists_tools_like_the_qwen_template():
    env = bfcl.BFCLEnv(bfcl.BFCLOptions(prompt_format="json"))
    system = env.reset("multi_turn_base_0")[0]["content"]
    assert "<tools>\n{" in system and "<tool_call>" in system
    tools = [json.loads(line) for line in system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()]
    assert [t["name"] for t in tools] == [d["name"] for d in bfcl.get_task("multi_turn_base_0").entry["function"]]
    result = env.step('<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>', [])
    assert result.observation.startswith("<tool_response>\n") and "document" in result.observation


def test_turn_structure_observations_and_episode_end():
    env = bfcl.BFCLEnv()
    env.reset("multi_turn_base_0")
    r = env.step("[cd(folder='document'), mkdir(dir_name='temp')]", [])
    assert not r.done and r.reward == 0.0 and r.info["calls"] == 2 and r.info["turn"] == 0
    assert r.observation.startswith("[{'role': 'tool', 'name': \"cd(folder='document')\"")  # the official format
    r = env.step("[mv(source='final_report.pdf', destination='temp')]", [])
    assert not r.done and "final_report.pdf" in r.observation
    r = env.step("Moved it.", [])  # no calls: the next user turn
    assert not r.done and r.observation.startswith("Perform a detailed search using grep")
    assert r.info["turn"] == 0 and env.turn == 1
    for text in ["[cd(folder='temp'), grep(file_name='final_report.pdf', pattern='budget analysis')]", "ok",
                 "[sort('final_report.pdf')]", "ok",
                 "[cd(folder='..'), mv(source='previous_report.pdf', destination='temp'), cd(folder='temp'), "
                 "diff(file_name1='final_report.pdf', file_name2='previous_report.pdf')]"]:
        r = env.step(text, [])
        assert not r.done
    r = env.step("All done.", [])
    assert r.done and r.reward == 1.0 and r.info["success"] and r.observation is None
    assert r.info["steps"] == 9 and r.info["rejections"] == 0
    with pytest.raises(RuntimeError):
        env.step("again", [])


def test_wrong_calls_score_zero():
    env = bfcl.BFCLEnv()
    env.reset("multi_turn_base_1")
    for text in ["[ls(a=False)]", "ok", "ok", "ok", "ok"]:
        r = env.step(text, [])
    assert r.done and r.reward == 0.0 and not r.info["success"] and r.info["error_type"]


def test_rejected_responses_execute_nothing_and_explain(monkeypatch):
    executed = []
    real = bfcl._call_backend
    monkeypatch.setattr(bfcl, "_call_backend", lambda methods, call: executed.append(call) or real(methods, call))
    env = bfcl.BFCLEnv()
    env.reset("multi_turn_base_0")
    for payload in ["[__import__('os').system('echo pwned')]", "[cd(folder=open('/etc/passwd').read())]",
                    "[rm(path='/')]", "[cd(folder='document'), mkdir(dir_name=1)]",
                    '<tool_call>{"name": "cd", "arguments": {"folder": "x"}, "x": 1}</tool_call>']:
        r = env.step(payload, [])
        assert not r.done and r.info["rejected"] and r.observation.startswith("Error: ")
        assert "No function was executed" in r.observation
    assert executed == [] and r.info["rejections"] == 5
    assert not [k for k in seeupo_keys() if k.startswith(env.model_name)]  # no backend was even created
    r = env.step("[cd(folder='document')]", [])
    assert executed == [ToolCall("cd", {"folder": "document"})] and not r.info["rejected"]


def test_miss_func_reveals_the_held_out_function_at_its_turn():
    task = bfcl.get_task("multi_turn_miss_func_0")
    (held,) = task.entry["missed_function"]["3"]
    assert held["name"] == "sort"
    env = bfcl.BFCLEnv()
    system = env.reset(task.id)[0]["content"]
    assert '"name": "sort"' not in system
    r = env.step("[sort(file_name='final_report.pdf')]", [])
    assert r.info["rejected"] and "unknown function 'sort'" in r.info["error"]
    for text in [task.ground_truth[0], "ok", task.ground_truth[1], "ok", "I cannot sort: no such function."]:
        r = env.step(text if isinstance(text, str) else "[" + ", ".join(text) + "]", [])
    assert env.turn == 3
    assert '"name": "sort"' in r.observation or "'name': 'sort'" in r.observation
    assert r.observation.endswith("I have updated some more functions you can choose from. What about now?")
    r = env.step("[sort(file_name='final_report.pdf')]", [])
    assert not r.info["rejected"] and r.info["calls"] == 1
    r = env.step("ok", [])
    r = env.step("[" + ", ".join(task.ground_truth[4]) + "]", [])
    r = env.step("done", [])
    assert r.done and r.info["rejections"] == 1
    assert r.reward == 1.0  # the early attempt was rejected, so it executed nothing


def test_long_context_backends_load_the_long_scenario():
    outputs = {}
    for category in ("multi_turn_base", "multi_turn_long_context"):
        env = bfcl.BFCLEnv()
        env.reset(f"{category}_1")
        assert env.long_context == (category == "multi_turn_long_context")
        outputs[category] = env.step("[cd(folder='workspace'), cd(folder='archive'), ls()]", []).observation
        instance = vars(multi_turn_utils)[f"{env.model_name}_{category}_1_GorillaFileSystem_instance"]
        assert instance.long_context == (category == "multi_turn_long_context")
        env.close()
    assert len(outputs["multi_turn_long_context"]) > len(outputs["multi_turn_base"])


# --------------------------------------------------------------------------- backend state


def test_two_episodes_of_one_task_do_not_interfere():
    a, b = bfcl.BFCLEnv(), bfcl.BFCLEnv()
    a.reset("multi_turn_base_0")
    b.reset("multi_turn_base_0")
    assert a.model_name != b.model_name
    a.step("[cd(folder='document'), mkdir(dir_name='temp')]", [])
    listing = b.step("[cd(folder='document'), ls()]", []).observation
    assert "final_report.pdf" in listing and "temp" not in listing
    # both still solve the task, interleaved step by step
    task = bfcl.get_task("multi_turn_base_0")
    script = []
    for calls in task.ground_truth:
        script += ["[" + ", ".join(calls) + "]", "ok"]
    a.reset(task.id), b.reset(task.id)
    results = []
    for text in script:
        results += [a.step(text, []), b.step(text, [])]
    assert results[-1].done and results[-2].done and results[-1].reward == results[-2].reward == 1.0


def test_no_backend_instances_leak_after_many_episodes():
    before = set(seeupo_keys())
    task = bfcl.get_task("multi_turn_base_3")
    for i in range(30):
        env = bfcl.BFCLEnv(bfcl.BFCLOptions(max_steps=4))
        env.reset(task.id)
        env.step("[" + ", ".join(task.ground_truth[0]) + "]", [])
        if i % 3 == 0:
            while not env.done:  # the step budget ends it
                env.step("[ls()]", [])
        elif i % 3 == 1:
            env.reset("multi_turn_base_4")  # a new episode on the same object
            env.step("[ls()]", [])
            env.close()
        else:
            pass  # abandoned mid-episode (the agent loop's max_turns or context limit): collected
        del env  # CPython finalizes at once (no reference cycles)
    gc.collect()
    assert set(seeupo_keys()) == before


# --------------------------------------------------------------------------- the executor


def backend_state(instance) -> dict:
    """All attributes of a backend instance, private ones included; a random generator by its state."""
    return {k: v.getstate() if isinstance(v, random.Random) else v for k, v in vars(instance).items()}


def gold_calls(task: bfcl.BFCLTask, calls: list[str]) -> list[ToolCall]:
    """The ground-truth calls of one turn as validated calls (the defects of KNOWN_DEFECTS as written)."""
    docs, out = all_docs(task), []
    for call in calls:
        (raw,) = parse_python(call)
        try:
            out.append(validate(raw, docs))
        except ToolCallError:
            assert task.id in KNOWN_DEFECTS and not raw.args
            out.append(ToolCall(raw.name, dict(raw.kwargs)))
    return out


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_executor_matches_bfcl_eval_on_every_ground_truth_episode(category):
    """``execute_calls`` calls the backend methods itself; on all 200 gold episodes of the category,
    turn by turn, its results and the full backend state equal those of bfcl-eval's executor
    run on the ground-truth call strings."""
    checked = 0
    for task in bfcl.load_category(category).values():
        ours, theirs = f"seeupo_ours_{uuid.uuid4().hex}", f"seeupo_theirs_{uuid.uuid4().hex}"
        args = (task.entry["initial_config"], task.entry["involved_classes"])
        long_context = category == "multi_turn_long_context"
        try:
            for calls in task.ground_truth:
                got = bfcl.execute_calls(gold_calls(task, calls), task, ours, long_context)
                want, their_instances = multi_turn_utils.execute_multi_turn_func_call(
                    calls, *args, theirs, task.id, long_context=long_context)
                assert got == want, (task.id, calls)
                _, our_instances = multi_turn_utils.execute_multi_turn_func_call(
                    [], *args, ours, task.id, long_context=long_context)
                assert our_instances.keys() == their_instances.keys()
                for name in our_instances:
                    assert our_instances[name] is not their_instances[name]
                    assert backend_state(our_instances[name]) == backend_state(their_instances[name]), (task.id, name)
                checked += len(calls)
        finally:
            bfcl._cleanup_globals(ours)
            bfcl._cleanup_globals(theirs)
    assert checked > 1000  # every category has more than 1,000 ground-truth calls (4,625 in all)


@pytest.mark.parametrize("fmt", ["python", "json"])
def test_string_arguments_reach_the_backend_unchanged(fmt):
    """bfcl-eval's executor prefixes every ``name(`` in a call string with the instance name, string
    literals included; the environment's calls give the backend the validated string itself."""
    content = "run ls(-a), then cd(..) && echo (x) # touch(f)"
    calls = [("touch", {"file_name": "notes.txt"}), ("echo", {"content": content, "file_name": "notes.txt"}),
             ("cat", {"file_name": "notes.txt"})]
    if fmt == "python":
        text = "[" + ", ".join(ToolCall(n, a).to_source() for n, a in calls) + "]"
    else:
        text = "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)
    env = bfcl.BFCLEnv(bfcl.BFCLOptions(prompt_format=fmt))
    env.reset("multi_turn_base_0")
    r = env.step(text, [])
    assert not r.info["rejected"] and r.info["calls"] == 3
    assert json.dumps({"file_content": content}) in r.observation
    fs = vars(multi_turn_utils)[f"{env.model_name}_multi_turn_base_0_GorillaFileSystem_instance"]
    assert fs._current_dir.contents["notes.txt"].content == content
    # what bfcl-eval's own executor would have written for the same call strings
    name = f"seeupo_theirs_{uuid.uuid4().hex}"
    task = env.task
    try:
        results, _ = multi_turn_utils.execute_multi_turn_func_call(
            env.decoded[0][0], task.entry["initial_config"], task.entry["involved_classes"], name, task.id)
    finally:
        bfcl._cleanup_globals(name)
    p = f"{name}_{task.id}_GorillaFileSystem_instance."
    assert json.loads(results[2])["file_content"] == f"run {p}ls(-a), then {p}cd(..) && {p}echo(x) # {p}touch(f)"
    env.close()


def test_every_documented_function_is_a_backend_method_the_executor_does_not_refuse():
    """``execute_calls`` resolves names among the instances' public methods and refuses bfcl-eval's
    refused names; every function the docs of any task list is such a method, and none is refused."""
    for category in bfcl.CATEGORIES:
        for task in bfcl.load_category(category).values():
            name = f"seeupo_methods_{uuid.uuid4().hex}"
            try:
                _, instances = multi_turn_utils.execute_multi_turn_func_call(
                    [], task.entry["initial_config"], task.entry["involved_classes"], name, task.id)
                methods = {m for inst in instances.values() for m in dir(inst)
                           if not m.startswith("_") and callable(getattr(inst, m))}
            finally:
                bfcl._cleanup_globals(name)
            documented = set(all_docs(task))
            assert documented <= methods, (task.id, documented - methods)
            assert not documented & set(bfcl._EXECUTOR_REFUSED)
    env = bfcl.BFCLEnv()
    env.reset("multi_turn_base_0")
    env.available["nothing"] = {"name": "nothing", "parameters": {"type": "dict", "properties": {}, "required": []}}
    assert "Error during execution: name 'nothing' is not defined" in env.step("[nothing()]", []).observation
    env.close()


# --------------------------------------------------------------------------- budget and rewards


def test_step_budget_truncates_and_fails():
    env = bfcl.BFCLEnv(bfcl.BFCLOptions(max_steps=2))
    env.reset("multi_turn_base_0")
    assert not env.step("[cd(folder='document')]", []).done
    r = env.step("[ls()]", [])
    assert r.done and r.reward == 0.0 and r.observation is None
    assert r.info["truncated"] and r.info["error_type"] == "multi_turn:force_terminated"


def test_budget_running_out_in_the_last_turn_is_scored():
    task = bfcl.get_task("multi_turn_base_0")
    script = []
    for calls in task.ground_truth:
        script += ["[" + ", ".join(calls) + "]", "ok"]
    env = bfcl.BFCLEnv(bfcl.BFCLOptions(max_steps=len(script) - 1))  # no room for the final "ok"
    env.reset(task.id)
    for text in script[:-1]:
        r = env.step(text, [])
    assert r.done and not r.info["truncated"] and r.reward == 1.0


def test_shaped_reward_success_partial_and_repetition():
    shaped = bfcl.BFCLOptions(reward="shaped", max_steps=30)
    task = bfcl.get_task("multi_turn_base_0")
    assert replay(task, "python", shaped)[0].reward == 1.5
    env = bfcl.BFCLEnv(shaped)
    env.reset(task.id)
    env.step("[" + ", ".join(task.ground_truth[0]) + "]", [])
    env.step("ok", [])
    env.step("[" + ", ".join(task.ground_truth[1]) + "]", [])
    for _ in range(3):
        r = env.step("no more", [])
    assert r.done and r.info["partial"] == pytest.approx(2 / 4) and r.reward == pytest.approx(0.25)
    assert not r.info["repetition"]
    env.reset(task.id)
    for _ in range(3):
        r = env.step("[cd(folder='nowhere')]", [])  # the same response three times in one user turn
    for _ in range(4):
        r = env.step("stop", [])
    assert r.done and r.info["repetition"] and r.reward == -1.0
    official = bfcl.BFCLEnv(bfcl.BFCLOptions(max_steps=30))
    official.reset(task.id)
    for _ in range(3):
        official.step("[cd(folder='nowhere')]", [])
    for _ in range(4):
        r = official.step("stop", [])
    assert r.info["repetition"] and r.reward == 0.0  # the detector only matters to the shaped reward


def test_irrelevance_checker_fails_calls_in_a_turn_that_should_have_none():
    task = bfcl.get_task("multi_turn_miss_param_0")
    assert task.ground_truth[3] == []
    results = {}
    for check in (True, False):
        env = bfcl.BFCLEnv(bfcl.BFCLOptions(max_steps=30, irrelevance_check=check))
        env.reset(task.id)
        for k, calls in enumerate(task.ground_truth):
            if k == 3:
                env.step("[ls()]", [])  # the user did not say which file: calls here are wrong
            if calls:
                env.step("[" + ", ".join(calls) + "]", [])
            r = env.step("ok", [])
        results[check] = r
    assert results[True].reward == 0.0 and "irrelevance" in results[True].info["error_type"]
    assert results[False].reward == 1.0


# --------------------------------------------------------------------------- splits and options


def test_paper_split_is_zero_to_99_train_and_100_to_199_test():
    train = bfcl.split_tasks(("multi_turn_base",), "paper", "train")
    test = bfcl.split_tasks(("multi_turn_base",), "paper", "test")
    assert train == [f"multi_turn_base_{i}" for i in range(100)]
    assert test == [f"multi_turn_base_{i}" for i in range(100, 200)]


def test_shuffled_split_is_stratified_disjoint_and_seeded():
    cats = ("multi_turn_base", "multi_turn_miss_func")
    train = bfcl.split_tasks(cats, "shuffled", "train", split_seed=3, test_fraction=0.25)
    test = bfcl.split_tasks(cats, "shuffled", "test", split_seed=3, test_fraction=0.25)
    assert not set(train) & set(test) and len(train) + len(test) == 400
    assert 80 <= len(test) <= 120
    assert bfcl.split_tasks(cats, "shuffled", "test", split_seed=3, test_fraction=0.25) == test
    assert bfcl.split_tasks(cats, "shuffled", "test", split_seed=4, test_fraction=0.25) != test
    strata = {}
    for task_id in train + test:
        key = (task_id.rsplit("_", 1)[0], tuple(sorted(bfcl.get_task(task_id).entry["involved_classes"])))
        strata.setdefault(key, [0, 0])[task_id in test] += 1
    for n_train, n_test in strata.values():
        assert n_test == round((n_train + n_test) * 0.25)


def test_options_are_validated():
    from seeupo.llm.envs import make_environment
    from seeupo.validation.errors import InputError

    for options, message in [({"categories": ["multi_turn_web"]}, "unknown category"),
                             ({"max_steps": 0}, "max_steps"), ({"reward": "dense"}, "reward"),
                             ({"split": "random"}, "split"), ({"colour": 1}, "unknown field"),
                             ({"max_steps": "10"}, "integer")]:
        with pytest.raises(InputError, match=message):
            make_environment("bfcl", options, None, 0)


def test_make_environment_builds_tasks_and_environments(tokenizer):
    from seeupo.llm.agent import ChatDelta
    from seeupo.llm.envs import make_environment

    spec = make_environment("bfcl", {"categories": ["multi_turn_base", "multi_turn_miss_param"], "subset": "test",
                                     "max_tasks": 150}, tokenizer, 0)
    assert len(spec.tasks) == 150 and spec.tasks[0] == "multi_turn_base_100" and spec.tasks[-1] == "multi_turn_miss_param_149"
    env = spec.make(None)
    messages = env.reset(spec.tasks[0])
    assert '"name": "cd"' in messages[0]["content"] or '"name":' in messages[0]["content"]
    assert all(f'"name": "{d["name"]}"' in messages[0]["content"] for d in bfcl.get_task(spec.tasks[0]).entry["function"])
    assert len(ChatDelta(tokenizer).prompt_ids(messages)) > 1000


def test_agent_loop_with_a_scripted_engine_scores_the_gold_episode(tokenizer):
    """run_episodes drives the environment token-in/token-out; a script of the gold calls earns 1."""
    from seeupo.llm.agent import AgentLimits, run_episodes
    from seeupo.llm.envs import make_environment
    from seeupo.llm.rollout import Completion, SamplingParams

    task = bfcl.get_task("multi_turn_base_1")
    script = []
    for calls in task.ground_truth:
        script += ["[" + ", ".join(calls) + "]", "Done."]

    class GoldEngine:
        def __init__(self):
            self.k = 0

        def generate(self, prompts, n, params):
            ids = tokenizer.encode(script[self.k], add_special_tokens=False) + [tokenizer.eos_token_id]
            self.k += 1
            return [[Completion(list(ids), [-0.1] * len(ids), "stop") for _ in range(n)] for _ in prompts]

        def sync_weights(self, model):
            pass

    spec = make_environment("bfcl", {"max_steps": 10}, tokenizer, 0)
    rollout = run_episodes(GoldEngine(), tokenizer, lambda: spec.make(None), [task.id], 2,
                           SamplingParams(max_new_tokens=256), AgentLimits(max_turns=10, max_context=200_000))
    assert [e.outcome for e in rollout.episodes] == ["done", "done"]
    assert [e.traj_return for e in rollout.episodes] == [1.0, 1.0]
    assert rollout.episodes[0].num_turns == len(script)


# --------------------------------------------------------------------------- import hygiene


def test_import_is_cheap_and_bfcl_writes_under_its_project_root(tmp_path):
    code = (
        "import sys, os\n"
        "import seeupo.llm.envs.bfcl as b\n"
        "assert 'bfcl_eval' not in sys.modules, 'bfcl_eval imported eagerly'\n"
        "b.load_category('multi_turn_base')\n"
        "from bfcl_eval.constants import eval_config\n"
        "print(eval_config.PROJECT_ROOT)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "BFCL_PROJECT_ROOT"}
    env["TMPDIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    root = out.stdout.strip()
    assert root.startswith(str(tmp_path)), root
    assert (tmp_path / root.rsplit("/", 1)[1] / "result").is_dir()


def test_trainer_builds_the_bfcl_environment(tmp_path):
    pytest.importorskip("transformers", reason="needs transformers and tokenizers (pip install -e '.[llm]')")
    from seeupo.llm.config import load_train_config
    from seeupo.llm.trainer import Trainer

    path = tmp_path / "bfcl.yaml"
    path.write_text(
        "model: {name: tiny-qwen3}\n"
        "env: {name: bfcl, options: {categories: [multi_turn_miss_func], subset: test, reward: shaped}}\n"
        "rollout: {tasks_per_step: 4, max_turns: 10, max_context: 65536}\n"
        f"steps: 1\nout_dir: {tmp_path / 'run'}\n"
    )
    trainer = Trainer(load_train_config(path))
    assert trainer.env.tasks == [f"multi_turn_miss_func_{i}" for i in range(100, 200)]
    tasks = trainer.tasks_for(1)
    assert len(tasks) == 4 and set(tasks) <= set(trainer.env.tasks)
    env = trainer.env.make(None)
    messages = env.reset(tasks[0])
    assert env.options.reward == "shaped"
    assert all(f'"name": "{d["name"]}"' in messages[0]["content"] for d in bfcl.get_task(tasks[0]).entry["function"])


def test_docs_list_parameters_in_the_backends_order_but_one():
    """Positional arguments are named by the docs' property order. It is the backend methods'
    order for every function of the 8 classes but ``TravelAPI.purchase_insurance`` (the docs swap
    ``booking_id`` and ``insurance_cost``): there the docs, which the model sees, decide."""
    import importlib
    import inspect

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    docs, classes = {}, set()
    for category in bfcl.CATEGORIES:
        for task in bfcl.load_category(category).values():
            docs.update(all_docs(task))
            classes.update(task.entry["involved_classes"])
    differ = []
    for cls_name in sorted(classes):
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
        for name, doc in docs.items():
            if hasattr(cls, name):
                signature = [p for p in inspect.signature(getattr(cls, name)).parameters if p != "self"]
                props = list(doc["parameters"]["properties"])
                if signature[: len(props)] != props:
                    differ.append(f"{cls_name}.{name}")
    assert sorted(set(differ)) == ["TravelAPI.purchase_insurance"]


def test_an_episode_the_agent_loop_stops_is_scored_as_truncated():
    env = bfcl.BFCLEnv(bfcl.BFCLOptions(reward="shaped"))
    env.reset("multi_turn_base_0")
    gold = bfcl.get_task("multi_turn_base_0").ground_truth[0]
    assert not env.step("[" + ", ".join(gold) + "]", []).done
    assert not env.step("done", []).done  # the first user turn is solved: partial credit 1 / 4 turns
    r = env.truncate("context")
    assert r.done and r.info["truncated"] and not r.info["success"] and r.info["outcome"] == "context"
    assert r.info["partial"] == pytest.approx(1 / bfcl.get_task("multi_turn_base_0").num_turns)
    assert r.reward == pytest.approx(0.5 * r.info["partial"])
    assert env.truncate("max_turns") is None  # already over
    assert not [k for k in seeupo_keys() if k.startswith(env.model_name)]  # backends released


def test_eval_tasks_are_the_test_subset_by_category(tokenizer):
    spec = make_environment("bfcl", {"categories": ["multi_turn_base", "multi_turn_miss_param"], "max_tasks": 3}, tokenizer, 0)
    assert len(spec.tasks) == 3
    assert spec.eval_tasks == [f"multi_turn_base_{i}" for i in range(100, 200)] + [
        f"multi_turn_miss_param_{i}" for i in range(100, 200)]
    assert {spec.category(t) for t in spec.eval_tasks} == {"multi_turn_base", "multi_turn_miss_param"}
