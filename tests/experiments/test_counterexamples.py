"""Counterexample files: every saved one replays, tampering and bad input are caught, records round-trip,
and the search's robustness test rejects drops that only come from an overshooting optimizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from seeupo import cli
from seeupo.core import preset
from seeupo.experiments import counterexamples as cx
from seeupo.experiments.counterexamples import Case, Counterexample, decrease, replay, robust_decrease, tightened
from seeupo.tabular.instances import InstanceError
from seeupo.tabular.problems import DTYPE, sequential_bandit
from seeupo.experiments.searches import get as get_search
from seeupo.tabular.train import RunConfig

FOLDER = Path(__file__).resolve().parents[2] / "paper_repro" / "counterexamples"
FILES = sorted(FOLDER.glob("*.json"))
MISSING = FOLDER / "<no counterexample files>"  # parametrized when the folder is empty, so the test fails


def _case(example: Counterexample) -> Case:
    """The :class:`Case` a counterexample was recorded from (start policy as probabilities)."""
    start = None
    if example.run.parameterization == "independent":
        with torch.no_grad():
            start = [p.clone() for p in example.policy().action_probs()]
    return Case(example.problem, start, example.algorithm, example.run, example.iterations)


def test_counterexample_folder_is_not_empty():
    assert FILES, f"no counterexample files in {FOLDER}: run `seeupo search` (the replay tests need them)"


@pytest.mark.parametrize("path", FILES or [MISSING], ids=lambda p: p.stem)
def test_saved_counterexample_replays(path):
    if path == MISSING:
        pytest.fail(f"no counterexample files in {FOLDER}")
    example = Counterexample.load(path)
    result = replay(example)
    assert result.reproduces, (
        f"{path.name}: recorded J {result.recorded}, recomputed {result.recomputed} (max diff {result.max_abs_diff:.3e})"
    )
    assert len(result.recomputed) == example.iterations + 1
    # it is a counterexample: J decreases, and no J exceeds the optimum
    drops = [a - b for a, b in zip(result.recomputed, result.recomputed[1:])]
    assert max(drops) > 0.0
    assert example.largest_decrease > 0.0
    assert max(result.recomputed) <= example.J_star + 1e-9
    # saved by `seeupo search` under the search's name, for that search's claim
    spec = get_search(path.stem)
    assert example.claim == spec.claim
    assert example.description


@pytest.mark.parametrize("path", FILES or [MISSING], ids=lambda p: p.stem)
def test_saved_counterexample_is_a_robust_decrease(path):
    """The search keeps only drops that survive a more careful inner loop; the saved case still does."""
    if path == MISSING:
        pytest.fail(f"no counterexample files in {FOLDER}")
    example = Counterexample.load(path)
    tol = float(example.search.get("tol", 1e-7))
    assert robust_decrease(_case(example), tol)


@pytest.fixture
def saved_file() -> Path:
    assert FILES, f"no counterexample files in {FOLDER}"
    return FILES[0]


def test_untampered_copy_replays_through_the_cli(saved_file, tmp_path, capsys):
    copy = tmp_path / saved_file.name
    copy.write_text(saved_file.read_text())
    assert cli.main(["replay", str(copy)]) == 0
    assert "reproduced" in capsys.readouterr().out


@pytest.mark.parametrize("index", [0, -1])
def test_tampered_copy_does_not_reproduce(saved_file, tmp_path, capsys, index):
    data = json.loads(saved_file.read_text())
    data["recorded"]["J"][index] += 1e-3
    tampered = tmp_path / f"tampered_{saved_file.name}"
    tampered.write_text(json.dumps(data))
    result = replay(Counterexample.load(tampered))
    assert not result.reproduces
    assert result.max_abs_diff == pytest.approx(1e-3, rel=1e-6)
    assert cli.main(["replay", str(tampered)]) == 1
    assert "DOES NOT REPRODUCE" in capsys.readouterr().out
    # one bad file among good ones still fails the command
    good = tmp_path / saved_file.name
    good.write_text(saved_file.read_text())
    assert cli.main(["replay", str(good), str(tampered)]) == 1


def test_tampered_instance_does_not_reproduce(saved_file, tmp_path):
    data = json.loads(saved_file.read_text())
    data["run"]["lr"] *= 2.0  # a different run than the one recorded
    path = tmp_path / "changed_lr.json"
    path.write_text(json.dumps(data))
    assert not replay(Counterexample.load(path)).reproduces
    assert cli.main(["replay", str(path)]) == 1


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        json.dumps({"format": "something-else/1"}),
        json.dumps({"format": cx.FORMAT, "claim": "B"}),  # keys missing
    ],
    ids=["invalid-json", "not-an-object", "wrong-format", "missing-keys"],
)
def test_malformed_file_exits_with_code_2(tmp_path, capsys, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InstanceError):
        Counterexample.load(path)
    assert cli.main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error" in err and len(err.strip().splitlines()) == 1


def test_unknown_algorithm_setting_exits_with_code_2(saved_file, tmp_path):
    data = json.loads(saved_file.read_text())
    data["algorithm"]["no_such_setting"] = 1
    path = tmp_path / "bad_setting.json"
    path.write_text(json.dumps(data))
    assert cli.main(["replay", str(path)]) == 2


def _set(data: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for key in parents:
        data = data[key]
    data[last] = value


@pytest.mark.parametrize(
    "path, value, field",
    [
        ("iterations", -1, "iterations"),
        ("iterations", 10**9, "iterations"),
        ("iterations", "1", "iterations"),
        ("iterations", True, "iterations"),
        ("algorithm", [1, 2], "algorithm"),
        ("algorithm.epochs", 10**9, "algorithm.epochs"),
        ("algorithm.epochs", 1.0, "algorithm.epochs"),
        ("algorithm.update", "sgd", "algorithm.update"),
        ("algorithm.group_size", 1, "algorithm"),  # AlgorithmConfig's own check: GRAE needs G >= 2
        ("algorithm.group_size", 1000, "algorithm.group_size"),  # exact GRAE batch too large
        ("algorithm.m_clip", [0.8, 1.2, 2.0], "algorithm.m_clip"),
        ("run.tasks", 0, "run.tasks"),
        ("run.lr", "0.1", "run.lr"),
        ("run.bogus", 1, "run.bogus"),
        ("policy_state", [], "policy_state"),
        ("recorded.J", [0.1], "recorded.J"),
        ("recorded.J_star", None, "recorded.J_star"),
        ("instance.gamma", "1", "instance.gamma"),
        ("claim", 3, "claim"),
    ],
)
def test_bad_field_names_the_field_exit_2(saved_file, tmp_path, capsys, path, value, field):
    data = json.loads(saved_file.read_text())
    _set(data, path, value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(InstanceError) as err:
        Counterexample.load(bad)
    assert err.value.field == field and err.value.source == str(bad)
    assert cli.main(["replay", str(bad)]) == 2
    assert capsys.readouterr().err == f"seeupo replay: error: {err.value}\n"


def test_policy_state_shape_is_checked(saved_file, tmp_path):
    data = json.loads(saved_file.read_text())
    key = next(iter(data["policy_state"]))
    data["policy_state"][key] = [[1.0]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(InstanceError, match=rf"field 'policy_state.{key}': expected shape"):
        Counterexample.load(bad)


def test_missing_file_exits_with_code_2(tmp_path):
    assert cli.main(["replay", str(tmp_path / "absent.json")]) == 2


def _same_problem(a, b) -> bool:
    fields = ("initial_state_probs", "obs_probs", "rewards", "terminal")
    same = all(
        all(torch.equal(x, y) for x, y in zip(getattr(a, f), getattr(b, f))) if isinstance(getattr(a, f), list)
        else torch.equal(getattr(a, f), getattr(b, f))
        for f in fields
    )
    return same and (
        a.actions_per_turn == b.actions_per_turn and a.obs_per_turn == b.obs_per_turn and a.gamma == b.gamma
        and a.tokens == b.tokens
    )


@pytest.mark.parametrize("path", FILES or [MISSING], ids=lambda p: p.stem)
def test_round_trip_to_dict_from_dict(path, tmp_path):
    if path == MISSING:
        pytest.fail(f"no counterexample files in {FOLDER}")
    example = Counterexample.load(path)
    data = example.to_dict()
    again = Counterexample.from_dict(json.loads(json.dumps(data)))  # through JSON text, as a file is
    assert again.to_dict() == data
    assert again.algorithm == example.algorithm and again.run == example.run
    assert again.J == example.J and again.J_star == example.J_star and again.iterations == example.iterations
    assert _same_problem(again.problem, example.problem)
    assert again.policy_state.keys() == example.policy_state.keys()
    assert all(torch.equal(again.policy_state[k], example.policy_state[k]) for k in example.policy_state)
    # and saving then loading gives the same record, which still replays
    saved = tmp_path / "again.json"
    again.save(saved)
    assert Counterexample.load(saved).to_dict() == data
    assert replay(Counterexample.load(saved)).reproduces


def test_record_of_a_fresh_case_round_trips_and_replays(tmp_path):
    problem = sequential_bandit(torch.ones(1, dtype=DTYPE), (2, 2), torch.tensor([[[1.0, 0.0], [0.0, 0.5]]], dtype=DTYPE))
    start = [torch.tensor([[[0.3, 0.7]]], dtype=DTYPE), torch.tensor([[[0.6, 0.4], [0.2, 0.8]]], dtype=DTYPE)]
    case = Case(problem, start, preset("seeupo", epochs=5, order="forward"), RunConfig(lr=0.05), iterations=2)
    example = cx.record(case, "D", "a fresh record")
    assert len(example.J) == 3
    path = tmp_path / "fresh.json"
    example.save(path)
    loaded = Counterexample.load(path)
    assert loaded.to_dict() == example.to_dict()
    assert replay(loaded).reproduces
    assert loaded.algorithm.order == "forward" and loaded.algorithm.m_clip == (0.8, 1.2)  # tuples come back as tuples


# ---------------------------------------------------------------------------------------------
# robust_decrease: a drop caused by an overshooting optimizer is not a counterexample
# ---------------------------------------------------------------------------------------------


def _overshooting_case() -> Case:
    """One turn, rewards (0, 0, 0.5); SeeUPO with parameters shared through random features, one
    Adam step of size 100: the sign step throws the policy onto a worse action. With a step 5
    times smaller and 5 epochs the same update improves J."""
    problem = sequential_bandit(torch.ones(1, dtype=DTYPE), (3,), torch.tensor([[0.0, 0.0, 0.5]], dtype=DTYPE))
    run = RunConfig(parameterization="shared", init_scale=1.0, seed=3, optimizer="adam", lr=100.0)
    return Case(problem, None, preset("seeupo", epochs=1), run, 1)


def test_tightened_only_changes_the_inner_loop():
    case = _overshooting_case()
    tight = tightened(case, factor=5)
    assert tight.run.lr == pytest.approx(case.run.lr / 5)
    assert tight.algorithm.epochs == case.algorithm.epochs * 5
    assert tight.algorithm.replace(epochs=case.algorithm.epochs) == case.algorithm
    assert dataclasses.replace(tight.run, lr=case.run.lr) == case.run
    assert tight.problem is case.problem and tight.iterations == case.iterations


def test_robust_decrease_rejects_an_overshoot():
    case = _overshooting_case()
    tol = 1e-7
    assert decrease(case) > tol, "precondition: the huge step lowers J"
    assert decrease(tightened(case)) <= tol, "precondition: a careful inner loop does not"
    assert not robust_decrease(case, tol)


def test_robust_decrease_needs_both_drops(monkeypatch):
    """The rule itself: a drop counts only if it survives tightening (whatever the engine does)."""
    case = _overshooting_case()
    for drawn, careful, expected in [(1.0, 0.0, False), (1.0, 1.0, True), (0.0, 1.0, False), (0.0, 0.0, False)]:
        monkeypatch.setattr(cx, "decrease", lambda c, d=drawn, k=careful: d if c.run.lr == case.run.lr else k)
        assert robust_decrease(case, 1e-7) is expected


def test_shrinking_stops_after_its_evaluations():
    """Every case with a nonzero reward fails (so a random failing case has much to shrink): shrinking stops after
    its count of evaluations, keeping the failing case as not minimal; without the limit it goes on."""
    from seeupo.experiments.counterexamples import search
    from seeupo.experiments.searches import algorithm_searches

    spec = algorithm_searches("grpo")[0]
    fails = lambda case: float(case.problem.rewards[0].abs().sum()) > 0  # noqa: E731
    result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=20, condition=fails,
                    shrink_calls=3)
    assert result.stopped == "" and result.found is not None and result.shrink_calls == 3
    assert "shrinking stopped after 3 evaluations" in result.found.search["stopped"]
    unlimited = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=20, condition=fails,
                       shrink_calls=None)
    assert unlimited.stopped == "" and unlimited.shrink_calls > 3 and "stopped" not in unlimited.found.search
    assert unlimited.examples == result.examples  # the same first failing case: only the shrinking differs


def test_a_search_evaluates_its_planned_cases_and_a_smaller_plan_is_a_prefix():
    """No clock decides what a search measures: it evaluates exactly its planned cases, the same ones on every run, and
    the cases of a plan of 8 are the first 8 of a plan of 30 (hypothesis draws with a fixed ``max_examples``)."""
    import json

    from seeupo.experiments.counterexamples import search
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.tabular.instances import problem_to_dict

    spec = algorithm_searches("grpo")[2]

    def drawn(n: int) -> list[str]:
        seen: list[str] = []

        def never(case) -> bool:
            seen.append(json.dumps(problem_to_dict(case.problem), sort_keys=True) + repr(case.algorithm) + repr(case.run)
                        + repr(case.start))
            return False

        result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=n, condition=never)
        assert result.examples == n == len(seen) and result.stopped == "" and result.found is None
        return seen

    small, large = drawn(8), drawn(30)
    assert small == large[:8] and drawn(30) == large
    assert len(set(large)) > 8  # the larger plan draws cases of its own


def test_a_decrease_found_by_a_small_plan_is_found_by_a_larger_one():
    """Nesting: the first failing case of a plan of 8 is the first of a plan of 40, so more cases never lose it."""
    from seeupo.experiments.counterexamples import search
    from seeupo.experiments.searches import algorithm_searches

    spec = algorithm_searches("grpo")[0]
    fails = lambda case: case.algorithm.group_size == 3  # noqa: E731 - some early case has G = 3
    small = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=8, condition=fails,
                   shrink_calls=0)
    large = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=40, condition=fails,
                   shrink_calls=0)
    assert small.found is not None and large.found is not None and small.examples == large.examples <= 8
    same = lambda found: {k: v for k, v in found.to_dict().items() if k != "search"}  # noqa: E731 - its plan differs
    assert same(small.found) == same(large.found)


def test_agentic_searches_record_their_family_and_verify_reads_it(tmp_path):
    """An agentic search's case is saved with its family as setting, and ``consult_counterexamples`` files it under
    that setting (not under MT, which its number of turns alone would say)."""
    from seeupo.experiments.counterexamples import case_setting, search
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import consult_counterexamples
    from seeupo.tabular.families import AGENTIC_FAMILIES

    specs = {spec.setting: spec for spec in algorithm_searches("grpo") if spec.setting}
    assert list(specs) == list(AGENTIC_FAMILIES)
    spec = specs["tool"]
    assert spec.name == "grpo_agentic_tool" and "stochastic tool results" in spec.description
    result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=3,
                    condition=lambda case: True, setting=spec.setting)
    found = result.found
    assert found is not None and found.search["setting"] == "tool" and case_setting(found) == "tool"
    assert 2 <= found.problem.num_turns <= 3 and found.problem.obs_per_turn[0] == 2  # two tool results
    found.save(tmp_path / f"{spec.name}.json")
    again = Counterexample.load(tmp_path / f"{spec.name}.json")
    assert case_setting(again) == "tool"
    consulted = consult_counterexamples(["grpo"], [str(tmp_path)])
    assert [e["setting"] for e in consulted] == ["tool"]
    # a file without a recorded setting is filed by its number of turns, as before
    assert case_setting(dataclasses.replace(again, search={})) == "MT"


def test_searches_off_policy_draw_their_cases_rows_as_the_rollouts_say_and_replay_them(tmp_path):
    """algorithm_searches(name, rollouts): every case's run has the staleness and the sampler, and a stale case runs one
    more iteration (its last update reads the first policy's rows); the saved case records them, consult files it
    under its rollouts, and the field's instances take them for another algorithm's run."""
    from seeupo.experiments.counterexamples import field_counterexamples, search
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import consult_counterexamples
    from seeupo.tabular.behaviour import Rollouts, Sampler

    rollouts = Rollouts(1, Sampler(temperature=0.8, top_k=1))
    spec = algorithm_searches("grpo", rollouts)[0]
    cases = []
    result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=3,
                    condition=lambda case: cases.append(case) or False)
    assert result.examples == 3 and len(cases) == 3
    assert all(c.run.staleness == 1 and c.run.sampler == rollouts.sampler and c.iterations == 2 for c in cases)
    found = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=1,
                   condition=lambda case: True).found
    found.save(tmp_path / "stale.json")
    again = Counterexample.load(tmp_path / "stale.json")
    assert again.run.staleness == 1 and again.run.sampler == rollouts.sampler and replay(again).reproduces
    (consulted,) = consult_counterexamples(["grpo"], [str(tmp_path)])
    assert consulted["rollouts"] == rollouts.words()
    _, instance = field_counterexamples()[0]
    case = instance.case(found.algorithm, "sgd", 0.5, 1, rollouts)
    assert case.run.staleness == 1 and case.run.sampler == rollouts.sampler and case.iterations == instance.iterations + 1
    assert instance.case(found.algorithm, "sgd", 0.5).run.sampler is None


def test_a_stop_wrapped_by_hypothesis_still_stops_the_search_with_its_case(monkeypatch):
    """Hypothesis replays the case it found once more at the end; a stop of ours raised inside that replay (shrinking's
    evaluations spent) comes back as a FlakyFailure (an exception group). Seen in a --quick check of a plugin: a
    traceback, exit 1. The search must unwrap it and keep the case, as not minimal."""
    import hypothesis
    from hypothesis.errors import FlakyFailure

    from seeupo.experiments.counterexamples import _ShrinkDone, _stop_inside, search
    from seeupo.experiments.searches import algorithm_searches

    spec = algorithm_searches("grpo")[0]

    def find(cases, test, **_):  # one failing case drawn, then shrinking's count runs out during the final replay
        test(Case(sequential_bandit(torch.ones(1, dtype=DTYPE), (2,), torch.tensor([[0.0, 1.0]], dtype=DTYPE)), None,
                  preset("grpo"), RunConfig(), 1))
        raise FlakyFailure("Inconsistent results from replaying a test case!", [_ShrinkDone(), AssertionError()])

    monkeypatch.setattr(hypothesis, "find", find)
    result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=5,
                    condition=lambda case: True)
    assert result.stopped == "" and result.found is not None
    assert "not minimal" in result.found.search["stopped"]
    assert isinstance(_stop_inside(BaseExceptionGroup("g", [ValueError(), BaseExceptionGroup("h", [KeyboardInterrupt()])])),
                      KeyboardInterrupt)
    assert _stop_inside(ExceptionGroup("g", [ValueError()])) is None
    with pytest.raises(ValueError):  # anything else is not ours: raised again
        monkeypatch.setattr(hypothesis, "find", lambda *a, **k: (_ for _ in ()).throw(ValueError("bug")))
        search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=5)
