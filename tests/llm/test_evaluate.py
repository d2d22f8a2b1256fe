"""seeupo eval: avg@k and pass@k per category, every episode logged as it finishes, resumable, checkpoints checked."""

from __future__ import annotations

import itertools
import json
import re

import pytest

pytest.importorskip("transformers")

from seeupo.cli import main  # noqa: E402
import seeupo.llm.evaluate as evaluate_module  # noqa: E402
from seeupo.llm.agent import StepResult  # noqa: E402
from seeupo.llm.checkpoint import save_checkpoint  # noqa: E402
from seeupo.llm.config import load_train_config  # noqa: E402
from seeupo.llm.envs import EnvSpec  # noqa: E402
from seeupo.llm.evaluate import evaluate_policy  # noqa: E402
from seeupo.llm.trainer import Trainer  # noqa: E402

SMALL = ["rollout.tasks_per_step=2", "algorithm.group_size=2", "env.options.warmup_steps=0", "env.options.num_tasks=4",
         "logging.progress=false", "rollout.max_turns=2"]


class Scripted:
    """Succeeds on every third episode started (a deterministic mix of successes across samples)."""

    started = itertools.count()

    def __init__(self):
        self.success = next(Scripted.started) % 3 == 0

    def reset(self, task):
        return [{"role": "user", "content": f"task {task}"}]

    def step(self, text, token_ids):
        return StepResult(None, 1.0 if self.success else 0.0, True, {"success": self.success})


def test_avg_and_pass_at_k_per_category(tmp_path):
    trainer = Trainer(load_train_config(None, SMALL), prepare=False)
    Scripted.started = itertools.count()
    trainer.env = EnvSpec(tasks=[], eval_tasks=list(range(5)), make=lambda generator: Scripted(),
                          category=lambda task: "even" if task % 2 == 0 else "odd", max_new_tokens=2)
    scores = evaluate_policy(trainer, 3, tmp_path, progress=False)
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 15 and all(e["prompt"] == [{"role": "user", "content": f"task {e['task']}"}] for e in episodes)
    # recompute from the log, independently of the scorer
    for score in scores:
        rows = {}
        for e in episodes:
            if e["category"] == score.category:
                rows.setdefault(e["task"], []).append(e["success"])
        assert score.tasks == len(rows) and score.samples == sum(map(len, rows.values()))
        assert score.avg_at_k == pytest.approx(sum(map(sum, rows.values())) / score.samples)
        assert score.pass_at_k == pytest.approx(sum(any(r) for r in rows.values()) / len(rows))
    assert {s.category for s in scores} == {"even", "odd"}
    assert 0 < sum(e["success"] for e in episodes) < 15  # a mix, so avg@k and pass@k differ
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["k"] == 3 and len(summary["categories"]) == 2


def test_eval_cli_on_a_trained_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    trainer = Trainer(load_train_config(None, SMALL + ["steps=1", f"out_dir={run}"]))
    trainer.train()
    out = tmp_path / "eval"
    args = ["eval", "--checkpoint", str(run), "--k", "2", "--out", str(out), "--no-progress"]
    assert main(args + [a for s in SMALL for a in ("--set", s)]) == 0
    assert "| all | 4 | 8 |" in capsys.readouterr().out
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 8
    before = (out / "episodes.jsonl").read_bytes()
    # an existing evaluation is never replaced silently
    assert main(args + ["--max-tasks", "3"] + [a for s in SMALL for a in ("--set", s)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not empty" in err and "--overwrite" in err
    assert (out / "episodes.jsonl").read_bytes() == before
    assert main(args + ["--max-tasks", "3", "--overwrite"] + [a for s in SMALL for a in ("--set", s)]) == 0
    assert "| all | 3 | 6 |" in capsys.readouterr().out
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6
    assert main(["eval", "--checkpoint", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "no checkpoint in" in capsys.readouterr().err


def test_prompts_longer_than_the_context_are_failures_not_a_crash(tmp_path):
    trainer = Trainer(load_train_config(None, SMALL + ["rollout.max_context=4"]), prepare=False)
    trainer.env = EnvSpec(tasks=[], eval_tasks=[0, 1, 2], make=lambda generator: Scripted(), max_new_tokens=2)
    (score,) = evaluate_policy(trainer, 2, tmp_path, progress=False)
    assert (score.tasks, score.samples, score.avg_at_k, score.pass_at_k) == (3, 6, 0.0, 0.0)
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and all(e["outcome"] == "context" and e["turns"] == [] for e in episodes)


def _without_times(path):
    """The lines of an episodes.jsonl without their wall times (the one field two runs may differ in)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        assert line.pop("seconds") >= 0
    return lines


@pytest.mark.parametrize("batch", [1, 2])
def test_an_interrupted_eval_resumes_to_the_episodes_of_an_uninterrupted_one(tmp_path, capsys, monkeypatch, batch):
    sets = [a for s in SMALL + ["rollout.temperature=1.0", "rollout.max_new_tokens=6"] for a in ("--set", s)]
    args = ["eval", "--k", "3", "--batch", str(batch), "--no-progress"] + sets
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(args + ["--out", str(whole)]) == 0
    expected = _without_times(whole / "episodes.jsonl")
    assert [(e["task_index"], e["sample"]) for e in expected] == [(t, g) for t in range(4) for g in range(3)]
    assert len({json.dumps(e["turns"]) for e in expected}) > 1  # sampled, so the seeds matter

    real, calls = evaluate_module.run_episodes, itertools.count()

    def interrupted(*a, **kw):
        if next(calls) == 3:
            raise KeyboardInterrupt  # like ctrl-C or a kill in the middle of the 4th batch
        return real(*a, **kw)

    monkeypatch.setattr(evaluate_module, "run_episodes", interrupted)
    assert main(args + ["--out", str(cut)]) == 130
    assert f"interrupted; {3 * batch} finished episodes" in capsys.readouterr().err
    monkeypatch.setattr(evaluate_module, "run_episodes", real)
    kept = _without_times(cut / "episodes.jsonl")
    assert kept == expected[: 3 * batch]  # what finished is on disk, written as it finished
    assert not (cut / "summary.json").exists()

    # a batch cut halfway by a crash: its first episode written, the second a partial line
    if batch == 2:
        lines = (cut / "episodes.jsonl").read_text().splitlines(keepends=True)
        (cut / "episodes.jsonl").write_text("".join(lines[:5]) + lines[5][:40])
    assert main(args + ["--out", str(cut), "--resume"]) == 0
    assert _without_times(cut / "episodes.jsonl") == expected
    summary = json.loads((cut / "summary.json").read_text())
    assert summary == json.loads((whole / "summary.json").read_text()) and summary["episodes"] == 12
    capsys.readouterr()


def test_resume_refuses_other_settings_and_leaves_the_folder_alone(tmp_path, capsys, monkeypatch):
    sets = [a for s in SMALL for a in ("--set", s)]
    out = tmp_path / "eval"
    base = ["eval", "--k", "2", "--max-tasks", "2", "--no-progress", "--out", str(out)]
    assert main(base + sets) == 0
    capsys.readouterr()
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    refused = {
        "k: 2 -> 3": ["eval", "--k", "3", "--max-tasks", "2"],
        "max_tasks: 2 -> 3": ["eval", "--k", "2", "--max-tasks", "3"],
        "batch: 1 -> 2": ["eval", "--k", "2", "--max-tasks", "2", "--batch", "2"],
        "config.rollout.temperature: 0.9 -> 0.5": ["eval", "--k", "2", "--max-tasks", "2", "--set", "rollout.temperature=0.5"],
        "checkpoint: None -> ": ["eval", "--k", "2", "--max-tasks", "2", "--checkpoint", str(tmp_path / "run")],
    }
    trainer = Trainer(load_train_config(None, SMALL + ["steps=1", f"out_dir={tmp_path / 'run'}"]))
    trainer.train()

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(Trainer, "__init__", no_model)  # every refusal below comes before the model loads
    for expected, args in refused.items():
        assert main(args + ["--no-progress", "--out", str(out), "--resume"] + sets) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err and "Traceback" not in err, (expected, err)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert main(["eval", "--out", str(tmp_path / "notes")]) == 2
    assert "is not empty (it holds other files)" in capsys.readouterr().err
    assert main(["eval", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "no evaluation to resume" in capsys.readouterr().err
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "eval_settings.json").write_bytes(files["eval_settings.json"])
    (edited / "episodes.jsonl").write_text(files["episodes.jsonl"].decode().replace('"sample": 1', '"sample": "1"'))
    assert main(base[:-1] + [str(edited), "--resume"] + sets) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2: not an episode record" in err
    assert main(["eval", "--out", str(out), "--resume", "--overwrite"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    monkeypatch.undo()
    # the same settings resume; nothing is left to roll out, and nothing changes but the summary's rewrite
    assert main(base + ["--resume"] + sets) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_a_checkpoint_of_another_model_is_one_line_naming_the_parameter(tmp_path, capsys):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from seeupo.llm.models import tiny_qwen3

    other, _ = tiny_qwen3(vocab=700)  # the tiny architecture, another vocabulary
    save_checkpoint(tmp_path / "run" / "checkpoints", 3, {"trainer": {"step": 3}},
                    sharded={"model": get_model_state_dict(other)})
    out = tmp_path / "eval"
    args = ["eval", "--checkpoint", str(tmp_path / "run"), "--k", "1", "--out", str(out), "--no-progress"]
    assert main(args + [a for s in SMALL for a in ("--set", s)]) == 2
    err = capsys.readouterr().err
    rows = other.model.embed_tokens.weight.shape[0]
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "step_00000003" in err and "'model.embed_tokens.weight'" in err and f"[{rows}, 64] in the checkpoint" in err
    model_rows = int(re.search(r"and \[(\d+), 64\] in the model", err).group(1))
    assert model_rows != rows
    assert not out.exists()  # refused before anything was written, and the folder it made is removed again


class Cut:
    """Ends after one turn (reporting ``truncated`` as BFCL does when its step budget ran out), or never."""

    def __init__(self, ends: bool, env_truncated: bool = False):
        self.ends, self.env_truncated = ends, env_truncated

    def reset(self, task):
        return [{"role": "user", "content": f"task {task}"}]

    def step(self, text, token_ids):
        info = {"success": False, "truncated": True} if self.env_truncated else {"success": False}
        return StepResult(None if self.ends else "more", 0.0, self.ends, info)


@pytest.mark.parametrize("ends, env_truncated, outcome, truncated", [
    (True, False, "done", False), (True, True, "done", True), (False, False, "max_turns", True)])
def test_truncated_says_which_cut(tmp_path, ends, env_truncated, outcome, truncated):
    trainer = Trainer(load_train_config(None, SMALL), prepare=False)
    trainer.env = EnvSpec(tasks=[], eval_tasks=[0, 1], make=lambda generator: Cut(ends, env_truncated), max_new_tokens=3)
    evaluate_policy(trainer, 2, tmp_path, progress=False)
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    for e in episodes:
        assert e["outcome"] == outcome and e["truncated"] is truncated
        assert len(e["turns"]) == (1 if ends else 2)
        for turn in e["turns"]:
            # a response that used the whole budget without the stop token is cut, whatever the episode did
            assert turn["response_truncated"] is (turn["finish_reason"] == "length")
            assert turn["response_tokens"] == 3 or not turn["response_truncated"]
        assert e["responses_truncated"] == sum(t["response_truncated"] for t in e["turns"])
    # the random tiny model rarely stops within 3 tokens: most responses are cut here
    assert sum(e["responses_truncated"] for e in episodes) >= len(episodes)


def test_load_model_weights_compares_names_and_shapes_before_loading(tmp_path):
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from seeupo.llm.checkpoint import load_model_weights
    from seeupo.validation.errors import InputError

    saved = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    path = save_checkpoint(tmp_path, 1, {"trainer": {"step": 1}}, sharded={"model": get_model_state_dict(saved)})
    cases = {
        "parameter '0.weight' has shape [2, 3] in the checkpoint and [2, 4] in the model": nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 1)),
        "it has no parameter '2.weight'": nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1), nn.Linear(1, 1)),
        "the model has no parameter '1.bias' (2 parameters of the checkpoint are not in the model)": nn.Sequential(nn.Linear(3, 2)),
    }
    for message, model in cases.items():
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(InputError, match=re.escape(message)) as err:
            load_model_weights(path, model)
        assert str(path) in str(err.value) and "\n" not in str(err.value)
        assert all(bool((a == b).all()) for a, b in zip(before, model.parameters()))  # nothing was loaded
    same = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    load_model_weights(path, same)
    assert all(bool((a == b).all()) for a, b in zip(saved.parameters(), same.parameters()))
