import json

import pytest
import torch

from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.instances import InstanceError, load_problem, policy_from_dict, problem_from_dict, problem_to_dict
from seeupo.tabular.policies import uniform_probs
from seeupo.tabular.problems import random_sequential_bandit, random_tree_mdp

BANDIT = {
    "kind": "sequential_bandit",
    "initial_state_probs": [0.25, 0.75],
    "actions_per_turn": [2, 3],
    "rewards": [[[1.0, 0.0, 0.2], [0.0, 0.5, 0.1]], [[0.0, 1.0, 0.3], [0.2, 0.0, 0.9]]],
}


def test_bandit_file_values_by_hand():
    problem = problem_from_dict(BANDIT)
    # J* = 0.25 * max(1.0, 0.5) + 0.75 * max(1.0, 0.9) = 1.0
    assert float(optimal(problem).J[0]) == pytest.approx(1.0)
    # uniform: 0.25 * mean(all six) + 0.75 * mean(all six)
    mean0 = (1.0 + 0.0 + 0.2 + 0.0 + 0.5 + 0.1) / 6
    mean1 = (0.0 + 1.0 + 0.3 + 0.2 + 0.0 + 0.9) / 6
    assert float(evaluate(problem, uniform_probs(problem)).J[0]) == pytest.approx(0.25 * mean0 + 0.75 * mean1)


def test_round_trip_bandit_tokens_and_tree_mdp():
    gen = torch.Generator().manual_seed(3)
    for problem in (
        random_sequential_bandit(1, (1, 1), tokens=(2, 2), reward_levels=3, generator=gen),
        random_sequential_bandit(1, (2, 3, 2), num_initial_states=2, generator=gen),
        random_tree_mdp(1, (2, 2), (2, 1), gamma=0.9, generator=gen),
    ):
        data = json.loads(json.dumps(problem_to_dict(problem)))
        again = problem_from_dict(data)
        assert again.tokens == problem.tokens and again.gamma == problem.gamma
        assert torch.allclose(optimal(again).J, optimal(problem).J)
        assert torch.allclose(evaluate(again, uniform_probs(again)).J, evaluate(problem, uniform_probs(problem)).J)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"kind": "bandit"}, "kind"),
        ({"initial_state_probs": [0.5, 0.6]}, "initial_state_probs"),
        ({"initial_state_probs": [-0.5, 1.5]}, "initial_state_probs"),
        ({"initial_state_probs": [0.5, float("nan")]}, "initial_state_probs"),
        ({"actions_per_turn": [2, 0]}, "actions_per_turn"),
        ({"actions_per_turn": "2,3"}, "actions_per_turn"),
        ({"rewards": [[[1.0, 0.0], [0.0, 0.5]], [[0.0, 1.0], [0.2, 0.0]]]}, "rewards"),
        ({"rewards": [[[1.0, 0.0, 0.2], [0.0, 0.5]], [[0.0, 1.0, 0.3], [0.2, 0.0, 0.9]]]}, "rewards"),
        ({"rewards": None}, "rewards"),
        ({"tokens": {"vocab_size": 2, "length": 2}}, "tokens"),
        ({"reward_noise": -1}, "reward_noise"),
    ],
)
def test_malformed_bandit_names_the_field(change, field):
    with pytest.raises(InstanceError) as err:
        problem_from_dict({**BANDIT, **change})
    assert err.value.field == field
    assert "\n" not in str(err.value) and f"'{field}'" in str(err.value)


def test_nan_reward_is_rejected():
    bad = json.loads(json.dumps(BANDIT))
    bad["rewards"][1][0][2] = float("nan")
    with pytest.raises(InstanceError, match="NaN"):
        problem_from_dict(bad)


def test_tree_mdp_validation():
    data = problem_to_dict(random_tree_mdp(1, (2, 2), (2, 2), generator=torch.Generator().manual_seed(0)))
    broken = json.loads(json.dumps(data))
    broken["observation_probs"][1][0][0] = [0.7, 0.7]
    with pytest.raises(InstanceError, match=r"observation_probs\[1\]"):
        problem_from_dict(broken)
    broken = json.loads(json.dumps(data))
    broken["terminal"][1][0][0][0] = False
    with pytest.raises(InstanceError, match="last turn"):
        problem_from_dict(broken)
    broken = json.loads(json.dumps(data))
    broken["gamma"] = 1.5
    with pytest.raises(InstanceError, match="gamma"):
        problem_from_dict(broken)


def test_policy_file_validation():
    problem = problem_from_dict(BANDIT)
    good = {"action_probs": [[[1.0, 0.0], [0.0, 1.0]], [[0, 1, 0]] * 4]}
    probs = policy_from_dict(good, problem)
    # s0=0 plays (0, 1): 0.0; s0=1 plays (1, 1): 0.0 ... computed from the table: rewards[s0][a0][1]
    assert float(evaluate(problem, probs).J[0]) == pytest.approx(0.25 * 0.0 + 0.75 * 0.0)
    with pytest.raises(InstanceError, match=r"action_probs\[1\]"):
        policy_from_dict({"action_probs": [[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.6, 0]] * 4]}, problem)
    with pytest.raises(InstanceError, match="one table per turn"):
        policy_from_dict({"action_probs": [[[1.0, 0.0], [0.0, 1.0]]]}, problem)


def test_unreadable_files(tmp_path):
    with pytest.raises(InstanceError, match="cannot read"):
        load_problem(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InstanceError, match="not valid JSON"):
        load_problem(tmp_path / "bad.json")


def test_an_end_token_round_trips_and_a_policy_file_may_not_play_an_impossible_answer():
    problem = random_sequential_bandit(1, (1,), tokens=(2, 2), end_token=0, reward_levels=3,
                                       generator=torch.Generator().manual_seed(1))
    data = json.loads(json.dumps(problem_to_dict(problem)))
    assert data["tokens"] == {"vocab_size": 2, "length": 2, "end_token": 0}
    again = problem_from_dict(data)
    assert again.end_token == 0 and again.possible_actions(0).tolist() == [True, False, True, True]
    assert torch.allclose(optimal(again).J, optimal(problem).J)
    policy_from_dict({"action_probs": [[[0.5, 0.0, 0.25, 0.25]]]}, again)
    with pytest.raises(InstanceError, match=r"action_probs\[0\].*action 1 is impossible"):
        policy_from_dict({"action_probs": [[[0.5, 0.1, 0.2, 0.2]]]}, again)
    with pytest.raises(InstanceError, match="tokens.end_token"):
        problem_from_dict({**data, "tokens": {"vocab_size": 2, "length": 2, "end_token": 2}})
