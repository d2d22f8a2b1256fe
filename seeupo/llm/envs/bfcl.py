"""BFCL v4 multi-turn (``env.name: bfcl``): the benchmark's own backends and checker, one episode per task.

Built on ``bfcl-eval`` (imported lazily: ``import seeupo.llm.envs.bfcl`` is cheap; install it with
``pip install --no-deps bfcl-eval==2026.3.23`` plus its few light dependencies, see the README).
Before ``bfcl_eval`` is imported, ``BFCL_PROJECT_ROOT`` is set (unless already set) to a folder
under the system temp dir, so the package writes nothing into site-packages or the repo.

**Episode** (as the official multi-turn harness runs it). ``reset(task_id)`` returns the system
prompt with the function docs of the task's API classes and the first user message. Each
assistant response is one *step*:

* a response with tool calls (:mod:`seeupo.llm.envs.toolcalls`: ``<tool_call>{json}</tool_call>``
  blocks or Python call syntax ``[f(a=1), g()]``) has its calls parsed and validated against the
  docs of the functions available *now*; each validated call is then made on this episode's
  backend instances with the validated keyword arguments (:func:`execute_calls`), so the backend
  receives exactly the validated values; the execution results are the observation;
* a response the parser or the validator rejects executes nothing; the observation is the
  error message (``info["rejected"]``; counted in ``info["rejections"]``). The official harness
  would end the user turn instead; here the model may retry;
* a response without tool calls ends the current user turn; the next user message is the
  observation. Ending the last user turn ends the episode.

``multi_turn_miss_func``: the held-out functions are absent from the system prompt and not
callable until their turn, whose user message reveals their docs (the official prompting text,
``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING``). ``multi_turn_long_context``: the
backends load the long-context scenario (``long_context=True``).

**Step budget** ``max_steps`` (paper: 10 assistant turns). When it runs out the episode ends:
if the last user message had been delivered, the calls made so far are scored as usual;
otherwise the episode is *truncated* and fails, as the official evaluation fails a
force-terminated entry (fewer turns than the ground truth). A task needs at least
``2 C + E - 1`` steps, ``C`` its user turns that need calls and ``E`` those that need none (a
response of calls and one that ends the turn, one for a turn without calls, and the last turn
need not be closed), so at ``max_steps: 10`` 12 of the paper's 100 ``multi_turn_base`` test tasks
(ids 100-199) and 1 of its 100 training tasks cannot be solved (the paper says 15). An episode the
agent loop stops first (``rollout.max_turns``, the context limit) is scored as truncated too
(:meth:`BFCLEnv.truncate`).

**Reward** at the last step (0 before): ``reward: official`` — 1 if the official checker passes
(``multi_turn_checker``, then ``multi_turn_irrelevance_checker`` when ``irrelevance_check``), else 0.
``reward: shaped`` — the paper's shaping: ``-1`` if the repetition detector fired, else ``1.5`` on
success, else ``0.5 * partial``, where

* ``partial = k / U``, ``k`` the largest number of leading user turns that pass the same
  checks when the checker is run on the first ``k`` turns only (the fraction of the task done
  correctly before the first failing turn; 0 for a truncated episode's undelivered turns);
* the **repetition detector** fires when ``repetition_threshold`` consecutive responses within one
  user turn are identical after collapsing whitespace (the model is looping: the same calls
  re-executed, or the same rejected text re-sent).

``info`` of the last step has ``success`` (the official verdict), ``error_type``, ``partial``
(shaped only), ``repetition``, ``truncated``, ``rejections``, ``steps``.

**Executor.** bfcl-eval's executor (``execute_multi_turn_func_call``) ``eval``-s call strings after
prefixing every ``name(`` in them with the instance name, string literals included, so a string
argument such as ``"run ls(x)"`` would reach the backend rewritten. :func:`execute_calls` lets
bfcl-eval create and cache the instances (the same function, called with no calls), then calls the
public methods directly, resolving names, refusing the same names and formatting results and
errors as bfcl-eval does: on every ground-truth episode the results and the backend state are
bfcl-eval's (tested). The **checker** is bfcl-eval's own and re-executes the call strings (from
:meth:`~seeupo.llm.envs.toolcalls.ToolCall.to_source`) with its executor, rewriting included, so
the verdict is the official one (a call whose string argument holds ``name(`` of a backend
method may then fail the state check even when it matches the ground truth; no ground-truth
call has such a string).

**Backend state.** bfcl-eval caches backend instances in the executor module's globals, keyed
by ``model_name`` and task id. Each episode uses a fresh ``model_name`` (``seeupo_<uuid>``);
the checker runs under derived names; every key of the episode is deleted when the episode
ends, on the next ``reset``, on :meth:`BFCLEnv.close`, or when the environment is garbage collected.

**Splits** (``split``, ``subset``): ``paper`` — per category, tasks ``0-99`` train and ``100-199``
test, unshuffled (the paper uses ``multi_turn_base``); ``shuffled`` — per category, stratified by
the set of involved API classes, each stratum shuffled with ``split_seed`` and a
``test_fraction`` of it (rounded) put in the test set.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import random
import tempfile
import uuid
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from seeupo.llm.agent import Message, StepResult
from seeupo.llm.envs import EnvSpec, register_env
from seeupo.llm.envs.toolcalls import ToolCall, ToolCallError, parse_response, validate

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
INSTALL_HINT = ('bfcl-eval is not installed: pip install -e ".[bfcl]" && pip install --no-deps bfcl-eval==2026.3.23 '
                "(`make .venv/bin/seeupo` does it)")

# the official multi-turn instruction of the classic prompt style (bfcl_eval.constants.default_prompts)
_JSON_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_JSON_TOOLS_FOOTER = ('\n</tools>\n\nFor each function call, return a json object with function name and arguments '
                      'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
                      '"arguments": <args-json-object>}\n</tool_call>')
# names bfcl-eval's executor refuses to run (a literal list inside execute_multi_turn_func_call)
_EXECUTOR_REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


def bfcl_project_root() -> Path:
    """Where bfcl-eval may write (``BFCL_PROJECT_ROOT``; set to a temp folder if unset)."""
    if not os.environ.get("BFCL_PROJECT_ROOT"):
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        os.environ["BFCL_PROJECT_ROOT"] = str(Path(tempfile.gettempdir()) / f"seeupo-bfcl-{uid}")
    root = Path(os.environ["BFCL_PROJECT_ROOT"])
    root.mkdir(parents=True, exist_ok=True)
    return root


def bfcl_available() -> bool:
    """Whether bfcl-eval (and what the prompts need) can be imported."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("bfcl_eval", "tree_sitter", "filelock"))


def _bfcl():
    """The bfcl-eval modules this environment uses (imported on first use)."""
    bfcl_project_root()
    try:
        from bfcl_eval import utils
        from bfcl_eval.constants import default_prompts
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
        from bfcl_eval.model_handler import utils as handler_utils
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return utils, default_prompts, multi_turn_checker, multi_turn_utils, handler_utils


@dataclass(frozen=True)
class BFCLTask:
    """One benchmark entry: ``entry`` as bfcl-eval loads it (function docs populated) and its ground truth."""

    id: str
    category: str
    index: int
    entry: dict
    ground_truth: list[list[str]]

    @property
    def num_turns(self) -> int:
        return len(self.entry["question"])


@functools.lru_cache(maxsize=None)
def load_category(category: str) -> dict[str, BFCLTask]:
    """The tasks of a multi-turn category, by id, in the benchmark's order."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; expected one of {list(CATEGORIES)}")
    utils = _bfcl()[0]
    entries = utils.load_file(utils.PROMPT_PATH / f"{utils.VERSION_PREFIX}_{category}.json", use_lock=False)
    entries = utils.populate_test_cases_with_predefined_functions(entries)
    answers = utils.load_file(utils.POSSIBLE_ANSWER_PATH / f"{utils.VERSION_PREFIX}_{category}.json", use_lock=False)
    truth = {a["id"]: a["ground_truth"] for a in answers}
    tasks = {}
    for entry in entries:
        index = int(entry["id"].rsplit("_", 1)[1])
        tasks[entry["id"]] = BFCLTask(entry["id"], category, index, entry, truth[entry["id"]])
    return tasks


def get_task(task: str | BFCLTask) -> BFCLTask:
    """A task from its id (``multi_turn_base_12``) or the task itself."""
    if isinstance(task, BFCLTask):
        return task
    category = str(task).rsplit("_", 1)[0]
    if category not in CATEGORIES:
        raise ValueError(f"not a BFCL multi-turn task id: {task!r}")
    tasks = load_category(category)
    if task not in tasks:
        raise ValueError(f"no BFCL task {task!r}")
    return tasks[task]


def split_tasks(categories: tuple[str, ...], split: str = "paper", subset: str = "train", split_seed: int = 0,
                test_fraction: float = 0.5) -> list[str]:
    """Task ids of one subset (see the module docstring), category by category."""
    out = []
    for category in categories:
        tasks = sorted(load_category(category).values(), key=lambda t: t.index)
        if split == "paper":
            half = len(tasks) // 2
            chosen = tasks[:half] if subset == "train" else tasks[half:]
        elif split == "shuffled":
            strata: dict[tuple[str, ...], list[BFCLTask]] = {}
            for t in tasks:
                strata.setdefault(tuple(sorted(t.entry["involved_classes"])), []).append(t)
            chosen = []
            for key in sorted(strata):
                members = list(strata[key])
                random.Random(f"{split_seed}:{category}:{'+'.join(key)}").shuffle(members)
                n_test = int(round(len(members) * test_fraction))
                chosen += members[:n_test] if subset == "test" else members[n_test:]
            chosen.sort(key=lambda t: t.index)
        else:
            raise ValueError(f"unknown split {split!r}")
        out += [t.id for t in chosen]
    return out


def _cleanup_globals(prefix: str) -> None:
    """Delete the backend instances bfcl-eval cached under names starting with ``prefix``."""
    import sys

    module = sys.modules.get("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    if module is None:
        return
    namespace = vars(module)
    for key in [k for k in namespace if k.startswith(prefix)]:
        namespace.pop(key, None)


def official_verdict(decoded: list[list[list[str]]], task: BFCLTask, model_name: str,
                     irrelevance_check: bool = True) -> dict:
    """The official checker's verdict on ``decoded`` (per user turn, per step, the executed call
    strings): ``{"valid": bool, "error_type": str | None}``. The checker re-executes the calls
    on fresh backends cached under ``model_name`` (callers clean them up)."""
    _, _, checker, _, _ = _bfcl()
    if len(decoded) != len(task.ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = checker.multi_turn_checker(decoded, task.ground_truth, task.entry, task.category, model_name)
            if result["valid"] and irrelevance_check:
                result = checker.multi_turn_irrelevance_checker(decoded, task.ground_truth)
    except Exception as err:  # the checker asserts on malformed input; a failure, not a crash
        return {"valid": False, "error_type": f"checker_exception:{type(err).__name__}"}
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type")}


def execute_calls(calls: list[ToolCall], task: BFCLTask, model_name: str, long_context: bool = False) -> list[str]:
    """Make validated ``calls`` on the task's backend instances cached under ``model_name``.

    The instances are bfcl-eval's: ``execute_multi_turn_func_call`` with no calls creates them
    (or finds them in its cache) exactly as it would for calls. The calls themselves are made here,
    with the validated keyword arguments (deep copies), because bfcl-eval's executor rewrites every
    ``name(`` in its call string, string literals included. Name resolution (public methods, a later
    class winning a shared name), refused names and the formatting of results and errors follow
    bfcl-eval's executor, so the results are the ones it returns for the same call strings."""
    multi_turn_utils = _bfcl()[3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, instances = multi_turn_utils.execute_multi_turn_func_call(
            [], task.entry["initial_config"], task.entry["involved_classes"], model_name, task.id,
            long_context=long_context, is_evaL_run=False,
        )
        methods: dict[str, Any] = {}
        for class_name in task.entry["involved_classes"]:
            for name, method in inspect.getmembers(instances[class_name], predicate=inspect.ismethod):
                if not name.startswith("_"):
                    methods[name] = method
        return [_call_backend(methods, call) for call in calls]


def _call_backend(methods: dict[str, Any], call: ToolCall) -> str:
    """One call's result text, as bfcl-eval's executor writes it."""
    if call.name in _EXECUTOR_REFUSED:
        return f"Error during execution: Function call {call.name} is not allowed."
    method = methods.get(call.name)
    if method is None:  # documented but not a backend method: never in the data, and nothing else is run
        return f"Error during execution: name {call.name!r} is not defined"
    try:
        result = method(**copy.deepcopy(call.arguments))
        if type(result) is str:
            return result
        if type(result) is dict:
            try:
                return json.dumps(result)
            except Exception:  # bfcl-eval: objects that are not serialisable are written with str()
                return str(result)
        return str(result)
    except Exception as err:
        return f"Error during execution: {err}"


@dataclass(frozen=True)
class BFCLOptions:
    """``env.options`` of ``env.name: bfcl`` (see the module docstring).

    categories: multi-turn categories to draw tasks from (any of :data:`CATEGORIES`).
    split, subset, split_seed, test_fraction: which tasks (``paper``: 0-99 train / 100-199 test);
      ``seeupo eval`` always scores the ``test`` subset of the split.
    max_tasks: keep only the first this many tasks of the subset (``null``: all).
    max_steps: assistant responses per episode (paper: 10).
    reward: ``official`` (1/0 from the official checker) or ``shaped`` (1.5 / 0.5 x partial / -1).
    irrelevance_check: also run ``multi_turn_irrelevance_checker`` after ``multi_turn_checker``.
    repetition_threshold: identical consecutive responses within a user turn that fire the
      repetition detector (shaped reward).
    prompt_format: ``python`` (BFCL's prompting system prompt, calls as ``[f(a=1)]``) or ``json``
      (Qwen/Hermes ``<tools>`` block, calls as ``<tool_call>{...}</tool_call>``); both formats
      are accepted either way.
    max_observation_chars: cut observations longer than this (``null``: never; long-context
      tasks can return long results).
    """

    categories: tuple[str, ...] = ("multi_turn_base",)
    split: Literal["paper", "shuffled"] = "paper"
    subset: Literal["train", "test"] = "train"
    split_seed: int = 0
    test_fraction: float = 0.5
    max_tasks: int | None = None
    max_steps: int = 10
    reward: Literal["official", "shaped"] = "official"
    irrelevance_check: bool = True
    repetition_threshold: int = 3
    prompt_format: Literal["python", "json"] = "python"
    max_observation_chars: int | None = None

    def __post_init__(self) -> None:
        if not self.categories:
            raise ValueError("categories: at least one category")
        for category in self.categories:
            if category not in CATEGORIES:
                raise ValueError(f"categories: unknown category {category!r}; expected some of {list(CATEGORIES)}")
        if len(set(self.categories)) != len(self.categories):
            raise ValueError("categories: repeated category")


BFCL_BOUNDS = {"split_seed": (0, 2**63 - 1), "test_fraction": (0.0, 1.0), "max_tasks": (1, 100_000),
               "max_steps": (1, 1000), "repetition_threshold": (2, 1000), "max_observation_chars": (100, 10**8)}


class BFCLEnv:
    """One BFCL multi-turn episode at a time (the agent loop makes one per trajectory).

    ``reset(task)`` takes a task id (``"multi_turn_base_12"``) or a :class:`BFCLTask`.
    """

    def __init__(self, options: BFCLOptions | None = None) -> None:
        self.options = options or BFCLOptions()
        self.task: BFCLTask | None = None
        self.model_name = ""
        self._finalizer: weakref.finalize | None = None
        self.done = True

    # ----------------------------------------------------------------- episode

    def reset(self, task: str | BFCLTask) -> list[Message]:
        self.close()
        self.task = get_task(task)
        self.model_name = f"seeupo_{uuid.uuid4().hex}"
        self._finalizer = weakref.finalize(self, _cleanup_globals, self.model_name + "_")
        entry = self.task.entry
        self.available = {doc["name"]: doc for doc in entry["function"]}
        self.held_out = {int(k): list(v) for k, v in (entry.get("missed_function") or {}).items()}
        self.long_context = "long_context" in self.task.category
        self.turn, self.steps, self.rejections = 0, 0, 0
        self.decoded: list[list[list[str]]] = [[]]
        self.responses: list[tuple[int, str]] = []  # (user turn, normalised text)
        self.done = False
        messages = copy.deepcopy(entry["question"][0])
        if 0 in self.held_out:  # never in the data; handled for completeness
            messages = [{"role": "user", "content": self._user_text(0)}]
        return self._with_system_prompt(messages, list(entry["function"]))

    def step(self, assistant_text: str, token_ids: list[int]) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self.steps += 1
        info: dict[str, Any] = {"turn": self.turn, "step": self.steps - 1, "rejected": False, "calls": 0}
        self.responses.append((self.turn, " ".join(str(assistant_text).split())))
        try:
            parsed = parse_response(assistant_text)
            calls = [validate(raw, self.available) for raw in parsed.calls]
            sources = [call.to_source() for call in calls]
        except ToolCallError as err:
            self.rejections += 1
            info.update(rejected=True, error=str(err), rejections=self.rejections)
            return self._continue(self._error_text(str(err)), info)
        info["format"] = parsed.format
        if sources:
            results = execute_calls(calls, self.task, self.model_name, self.long_context)
            self.decoded[self.turn].append(sources)
            info["calls"] = len(sources)
            return self._continue(self._results_text(sources, results), info)
        # no calls: this user turn is over
        if self.turn + 1 == self.task.num_turns:
            return self._finish(info, truncated=False)
        self.turn += 1
        self.decoded.append([])
        return self._continue(self._user_text(self.turn), info)

    def truncate(self, outcome: str) -> StepResult | None:
        """The agent loop ended the episode (``max_turns`` or the context limit): score it as truncated."""
        if self.task is None or self.done:
            return None
        return self._finish({"turn": self.turn, "step": self.steps, "outcome": outcome}, truncated=True)

    def close(self) -> None:
        """Forget this episode's backend instances (also done when the episode ends)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None

    # ----------------------------------------------------------------- internals

    def _continue(self, observation: str, info: dict) -> StepResult:
        if self.steps >= self.options.max_steps:
            return self._finish(info, truncated=self.turn + 1 < self.task.num_turns)
        limit = self.options.max_observation_chars
        if limit is not None and len(observation) > limit:
            observation = observation[:limit] + f"\n[... {len(observation) - limit} characters cut]"
        return StepResult(observation, 0.0, False, info)

    def _finish(self, info: dict, truncated: bool) -> StepResult:
        task, opts = self.task, self.options
        decoded = self.decoded + [[] for _ in range(task.num_turns - len(self.decoded))]
        try:
            if truncated:
                verdict = {"valid": False, "error_type": "multi_turn:force_terminated"}
            else:
                verdict = official_verdict(decoded, task, self.model_name + "_check", opts.irrelevance_check)
            repetition = self._repetition()
            info.update(success=verdict["valid"], error_type=verdict["error_type"], truncated=truncated,
                        repetition=repetition, rejections=self.rejections, steps=self.steps)
            if opts.reward == "official":
                reward = 1.0 if verdict["valid"] else 0.0
            else:
                partial = 1.0 if verdict["valid"] else self._partial(decoded)
                info["partial"] = partial
                reward = -1.0 if repetition else (1.5 if verdict["valid"] else 0.5 * partial)
        finally:
            self.done = True
            self.close()
        return StepResult(None, reward, True, info)

    def _partial(self, decoded: list[list[list[str]]]) -> float:
        """``k / U``: the leading user turns that pass the checks on their own (see the module docstring)."""
        task = self.task
        prefix_task_turns = 0
        for k in range(1, task.num_turns + 1):
            sub = BFCLTask(task.id, task.category, task.index, task.entry, task.ground_truth[:k])
            verdict = official_verdict(decoded[:k], sub, f"{self.model_name}_prefix{k}", self.options.irrelevance_check)
            if not verdict["valid"]:
                break
            prefix_task_turns = k
        return prefix_task_turns / task.num_turns

    def _repetition(self) -> bool:
        run, last = 0, None
        for item in self.responses:
            run = run + 1 if item == last else 1
            last = item
            if run >= self.options.repetition_threshold:
                return True
        return False

    # ----------------------------------------------------------------- texts

    def _with_system_prompt(self, messages: list[Message], functions: list[dict]) -> list[Message]:
        handler_utils = _bfcl()[4]
        if self.options.prompt_format == "python":
            return handler_utils.system_prompt_pre_processing_chat_model(messages, functions, self.task.id)
        default_prompts = _bfcl()[1]
        behaviour = default_prompts.PROMPT_STYLE_TEMPLATES["classic"]["multiturn_behavior"]
        system = f"{_json_tools(functions)}\n\n{behaviour}"
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system}
        else:
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def _user_text(self, turn: int) -> str:
        default_prompts = _bfcl()[1]
        if turn in self.held_out:
            docs = self.held_out[turn]
            for doc in docs:
                self.available[doc["name"]] = doc
            if self.options.prompt_format == "python":
                return default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)
            return f"{_json_tools(docs)}\n\n{default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}"
        return "\n\n".join(m["content"] for m in self.task.entry["question"][turn])

    def _results_text(self, sources: list[str], results: list[str]) -> str:
        if self.options.prompt_format == "python":
            handler_utils = _bfcl()[4]
            return handler_utils.format_execution_results_prompting({}, results, {"model_responses_decoded": sources})
        return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)

    def _error_text(self, message: str) -> str:
        if self.options.prompt_format == "python":
            how = "write calls as [func_name(param=value, ...), ...]"
        else:
            how = 'write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
        return f"Error: {message}. No function was executed. To call functions, {how}; to finish this turn, reply without calls."


def _json_tools(functions: list[dict]) -> str:
    return _JSON_TOOLS_HEADER + "".join(f"\n{json.dumps(doc)}" for doc in functions) + _JSON_TOOLS_FOOTER


@register_env("bfcl", options=BFCLOptions, bounds=BFCL_BOUNDS)
def make_bfcl(opts: BFCLOptions, tokenizer: Any, seed: int) -> EnvSpec:
    """The :class:`~seeupo.llm.envs.EnvSpec` of ``env.name: bfcl`` (options: :class:`BFCLOptions`)."""
    from seeupo.validation.errors import InputError

    if not bfcl_available():
        raise InputError("config.env.name", INSTALL_HINT)
    tasks = split_tasks(opts.categories, opts.split, opts.subset, opts.split_seed, opts.test_fraction)
    if opts.max_tasks is not None:
        tasks = tasks[: opts.max_tasks]
    if not tasks:
        raise InputError("config.env.options", "the chosen split has no tasks")
    # `seeupo eval` scores the test subset of the same split, category by category (paper: tasks 100-199)
    eval_tasks = split_tasks(opts.categories, opts.split, "test", opts.split_seed, opts.test_fraction)
    return EnvSpec(tasks=tasks, make=lambda generator: BFCLEnv(opts), eval_tasks=eval_tasks,
                   category=lambda task: str(task).rsplit("_", 1)[0])

