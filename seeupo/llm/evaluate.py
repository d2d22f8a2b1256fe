"""``seeupo eval``: avg@k and pass@k of a policy on an environment's evaluation tasks.

Every evaluation task is rolled out ``k`` times with the config's sampling settings. An
episode succeeds when its last turn reports ``info["success"]`` true (BFCL: the official
checker's verdict), or, for an environment that reports none, when its return is positive.

* ``avg@k``: the mean success over all ``k`` samples of all tasks of a category;
* ``pass@k``: the share of tasks of the category with at least one success among its ``k``.

**Episodes and their seeds.** Episode ``e = task_index * k + sample`` is rolled out in a batch
of ``batch`` consecutive episodes (default 1: each alone). A batch's sampling seed and its
environments' generator derive only from the config's seed and the batch's first episode, so
an episode's result does not depend on which episodes ran before it: a resumed evaluation gives
exactly the episodes of an uninterrupted one (with the same ``batch``; the engine samples a
batch from one random stream, so another ``batch`` gives other, equally valid, samples).

**Output folder.** ``episodes.jsonl`` gets one line per episode as its batch finishes (flushed):
``task_index``, ``sample``, ``task``, ``category``, ``success``, ``return``, ``outcome``,
``truncated``, ``seconds``, the prompt messages and every turn (see :func:`episode_record`).
``eval_settings.json`` holds what the episodes depend on (config sections, ``k``, checkpoint,
``max_tasks``, ``batch``) so that a resume can refuse other settings; ``summary.json`` /
``summary.md`` are written at the end from every episode in ``episodes.jsonl``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from seeupo.llm.agent import AgentLimits, EpisodeRecord, NoPromptFits, TurnRecord, run_episodes
from seeupo.llm.config import changed_leaves
from seeupo.llm.rollout import SamplingParams
from seeupo.validation.errors import InputError

EPISODES = "episodes.jsonl"
SETTINGS = "eval_settings.json"
SUMMARY_FILES = ("summary.json", "summary.md")
OUTPUT_FILES = (EPISODES, SETTINGS, *SUMMARY_FILES)
# the config sections an evaluation's episodes depend on (the rest is training-only)
CONFIG_SECTIONS = ("model", "env", "rollout", "seed")


@dataclass(frozen=True)
class CategoryScore:
    category: str
    tasks: int
    samples: int
    avg_at_k: float
    pass_at_k: float
    mean_return: float


def eval_settings(cfg: Any, k: int, checkpoint: Path | None, max_tasks: int | None, batch: int) -> dict[str, Any]:
    """What the episodes of an evaluation depend on; a resume must find the same."""
    config = cfg.to_dict()
    return {
        "config": {key: config[key] for key in CONFIG_SECTIONS},
        "k": k,
        "checkpoint": None if checkpoint is None else str(Path(checkpoint).resolve()),
        "max_tasks": max_tasks,
        "batch": batch,
    }


def check_output(out_dir: Path, settings: dict[str, Any], *, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse (``InputError``) an output folder that an evaluation with ``settings`` must not write to.

    An earlier evaluation's results are never replaced silently: a non-empty folder is refused
    unless ``overwrite`` (its evaluation files are then deleted by :func:`start_output`; other
    files are left alone) or ``resume`` (the folder must hold an evaluation with the same
    settings, whose finished episodes are kept). Only reads, so that it can run before the
    model loads and a refusal costs nothing.
    """
    if resume and overwrite:
        raise InputError(None, "--resume and --overwrite exclude each other")
    if resume:
        if not (out_dir / SETTINGS).is_file():
            raise InputError(None, f"--resume: {out_dir} holds no evaluation to resume (no {SETTINGS})")
        try:
            saved = json.loads((out_dir / SETTINGS).read_text())
        except (OSError, ValueError) as err:
            raise InputError(None, f"--resume: cannot read {out_dir / SETTINGS}: {err}") from None
        changes = [f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed_leaves(saved, settings).items()]
        if changes:
            raise InputError(None, f"--resume: {out_dir} was evaluated with other settings ({'; '.join(changes)}); "
                                   "resume with the same ones, or use another --out or --overwrite")
        read_episodes(out_dir / EPISODES, repair=False)  # a damaged log is refused now, not after the model loads
    elif not overwrite and out_dir.is_dir() and any(out_dir.iterdir()):
        present = [name for name in OUTPUT_FILES if (out_dir / name).exists()]
        what = f"an evaluation ({', '.join(present)})" if present else "other files"
        raise InputError(None, f"--out: {out_dir} is not empty (it holds {what}); pass --resume to continue an "
                               "interrupted evaluation, --overwrite to replace it, or another --out")


def start_output(out_dir: Path, settings: dict[str, Any], *, resume: bool = False) -> None:
    """Write ``settings`` to a folder :func:`check_output` accepted (a fresh evaluation: its old files deleted)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        return
    for name in OUTPUT_FILES:
        (out_dir / name).unlink(missing_ok=True)
    (out_dir / SETTINGS).write_text(json.dumps(settings, indent=1) + "\n")


def episode_seed(cfg_seed: int, first_episode: int) -> int:
    """The seed of the batch starting at episode ``first_episode``: a function of these two only."""
    # well mixed (neighbouring episodes get unrelated streams) and below 2**31, which every engine takes
    return int(np.random.SeedSequence([cfg_seed, first_episode]).generate_state(1)[0] >> 1)


def _success(turns: list[Any], episode_return: float) -> bool:
    last = turns[-1].info if turns else {}
    return bool(last["success"]) if "success" in last else episode_return > 0


def episode_record(task_index: int, sample: int, task: Any, category: str, episode: EpisodeRecord,
                   turns: list[TurnRecord], seconds: float) -> dict[str, Any]:
    """One line of ``episodes.jsonl``.

    Two kinds of cut, logged apart because they mean different things:

    * per turn, ``response_truncated``: the response ended without a stop token, at
      ``max_new_tokens`` or at the context limit (``finish_reason: "length"``);
    * per episode, ``truncated``: the episode ended before the task did — the agent loop stopped
      it (``outcome`` ``"max_turns"`` or ``"context"``), or the environment ended it unfinished
      (BFCL: its step budget ran out before the last user turn, ``info.truncated`` of the last turn).
    """
    last = turns[-1].info if turns else {}
    return {
        "task_index": task_index, "sample": sample, "task": _jsonable(task), "category": category,
        "success": _success(turns, episode.traj_return), "return": episode.traj_return, "outcome": episode.outcome,
        "truncated": episode.outcome != "done" or bool(last.get("truncated", False)),
        "responses_truncated": sum(t.finish_reason == "length" for t in turns),
        "seconds": round(seconds, 3), "prompt": episode.messages,
        "turns": [{"context_tokens": t.context_tokens, "response": t.response_text, "response_tokens": t.response_tokens, "finish_reason": t.finish_reason,
                   "response_truncated": t.finish_reason == "length", "observation": t.observation, "reward": t.reward,
                   "info": _jsonable(t.info)} for t in turns],
    }


def read_episodes(path: Path, *, repair: bool = True) -> list[dict[str, Any]]:
    """The complete lines of an ``episodes.jsonl``; with ``repair``, a last line cut by a crash is removed from the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):  # an interrupted write: drop the partial line so appends start on a fresh one
        with path.open("r+b") as f:
            f.truncate(end)
    records = []
    for number, line in enumerate(data[:end].decode(errors="replace").splitlines(), 1):
        try:
            record = json.loads(line)
            if not (isinstance(record, dict) and isinstance(record.get("task_index"), int) and isinstance(record.get("sample"), int)):
                raise ValueError("not an episode record (task_index, sample)")
        except ValueError as err:  # a file edited or written by something else: refuse, never guess
            raise InputError(None, f"--resume: {path}, line {number}: {err}") from None
        records.append(record)
    return records


def evaluate_policy(trainer: Any, k: int, out_dir: Path, *, batch: int = 1, max_tasks: int | None = None,
                    progress: bool = True, resume: bool = False) -> list[CategoryScore]:
    """Roll out ``k`` samples of every evaluation task with ``trainer``'s model and environment.

    ``trainer`` is a :class:`seeupo.llm.trainer.Trainer` (its model already loaded from a
    checkpoint by the caller); episodes are rolled out ``batch`` at a time and appended to
    ``out_dir/episodes.jsonl`` as each batch finishes; ``max_tasks`` keeps the first that many
    evaluation tasks. With ``resume`` the episodes already in ``episodes.jsonl`` are kept and
    not rolled out again (the caller checks the settings: :func:`check_output`).
    """
    cfg, env = trainer.cfg, trainer.env
    tasks = env.eval_tasks if env.eval_tasks is not None else env.tasks
    tasks = tasks[:max_tasks] if max_tasks is not None else tasks
    category = env.category or (lambda _task: "all")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / EPISODES
    records = read_episodes(path) if resume else []
    done = {(r["task_index"], r["sample"]) for r in records}
    for r in records:
        if not (0 <= r["task_index"] < len(tasks)) or r["task"] != json.loads(json.dumps(_jsonable(tasks[r["task_index"]]))):
            raise InputError(None, f"--resume: {path} has episodes of other tasks (task {r['task_index']}: {r['task']!r})")
    total = len(tasks) * k
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=len(done), unit="episode", dynamic_ncols=True, desc=f"eval {len(tasks)} tasks x {k}")
    try:
        with path.open("a" if resume else "w") as log:
            for start in range(0, total, batch):
                ids = list(range(start, min(start + batch, total)))
                if all(divmod(e, k) in done for e in ids):
                    continue
                began = time.perf_counter()
                for record in _rollout(trainer, [tasks[e // k] for e in ids], start):
                    e = ids[record.pop("_index")]
                    task_index, sample = divmod(e, k)
                    if (task_index, sample) in done:  # finished before an interruption: kept as it was
                        continue
                    episode, turns = record["episode"], record["turns"]
                    line = episode_record(task_index, sample, tasks[task_index], category(tasks[task_index]), episode, turns,
                                          time.perf_counter() - began)
                    log.write(json.dumps(line) + "\n")
                    log.flush()
                    records.append(line)
                    if bar is not None:
                        bar.update(1)
    finally:  # the bar ends on its own line, also when interrupted
        if bar is not None:
            bar.close()
    scores = score_episodes(records)
    summary = {"k": k, "checkpoint_step": trainer.step_count, "episodes": len(records),
               "categories": [s.__dict__ for s in scores]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out_dir / "summary.md").write_text(markdown(scores, k))
    return scores


def _rollout(trainer: Any, tasks: list[Any], first_episode: int) -> Iterator[dict[str, Any]]:
    """Roll out one episode of each of ``tasks`` (one batch); yield each with its turns."""
    cfg, env = trainer.cfg, trainer.env
    seed = episode_seed(cfg.seed, first_episode)
    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
        max_new_tokens=env.max_new_tokens or cfg.rollout.max_new_tokens,
        stop_token_ids=(trainer.tokenizer.eos_token_id,), seed=seed,
    )
    try:
        rollout = run_episodes(trainer.engine, trainer.tokenizer, lambda: env.make(generator), tasks, 1, params,
                               AgentLimits(max_turns=cfg.rollout.max_turns, max_context=cfg.rollout.max_context))
        episodes, turns_of = rollout.episodes, rollout.turns
    except NoPromptFits:  # no prompt of this batch fits the context: every episode fails unplayed
        episodes = [EpisodeRecord(b, b, task, 0, 0.0, "context") for b, task in enumerate(tasks)]
        turns_of = []
    by_traj: dict[int, list[TurnRecord]] = defaultdict(list)
    for turn in turns_of:
        by_traj[turn.traj_id].append(turn)
    for episode in episodes:
        yield {"_index": episode.traj_id, "episode": episode, "turns": by_traj[episode.traj_id]}


def score_episodes(records: list[dict[str, Any]]) -> list[CategoryScore]:
    """avg@k, pass@k and the mean return per category, from ``episodes.jsonl`` lines."""
    successes: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    returns: dict[str, list[float]] = defaultdict(list)
    for r in records:
        successes[r["category"]][r["task_index"]].append(bool(r["success"]))
        returns[r["category"]].append(r["return"])
    scores = []
    for cat, by_task in sorted(successes.items()):
        rows = list(by_task.values())
        samples = sum(map(len, rows))
        scores.append(CategoryScore(cat, len(rows), samples, sum(map(sum, rows)) / max(1, samples),
                                    sum(any(r) for r in rows) / max(1, len(rows)), sum(returns[cat]) / max(1, len(returns[cat]))))
    return scores


def markdown(scores: list[CategoryScore], k: int) -> str:
    lines = [f"| category | tasks | samples | avg@{k} | pass@{k} | mean return |", "|---|---|---|---|---|---|"]
    lines += [f"| {s.category} | {s.tasks} | {s.samples} | {s.avg_at_k:.3f} | {s.pass_at_k:.3f} | {s.mean_return:.3f} |"
              for s in scores]
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    """``value`` as JSON (unknown objects by their ``repr``)."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)
