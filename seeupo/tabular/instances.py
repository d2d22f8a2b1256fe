"""The instance file format (JSON) for tabular problems and policies, with strict validation.

Sequential bandit (the paper's model)::

    {"kind": "sequential_bandit",
     "initial_state_probs": [p_1, ..., p_S0],           # sums to 1
     "actions_per_turn": [A_1, ..., A_T],
     "rewards": <nested list of shape S0 x A_1 x ... x A_T>,
     "tokens": {"vocab_size": V, "length": L},          # optional: every A_t = V**L; with
                                                        # "end_token": k, answers end at token k
     "reward_noise": 0.0}                               # optional: reward noise std (sampled mode)

Tree MDP (flat history index ``h_{t+1} = (h_t * A_t + a_t) * O_t + o_t``, ``h_0 = s0``; turn
``t`` has ``N_t = S0 * prod_{k<t} A_k O_k`` histories)::

    {"kind": "tree_mdp",
     "initial_state_probs": [...],
     "actions_per_turn": [A_1, ..., A_T],
     "observations_per_turn": [O_1, ..., O_T],
     "observation_probs": [<N_t x A_t x O_t>, ...],     # one per turn, rows sum to 1
     "rewards": [<N_t x A_t x O_t>, ...],
     "terminal": [<N_t x A_t x O_t booleans>, ...],     # the last turn must be all true
     "gamma": 1.0, "tokens": ..., "reward_noise": ...}  # optional

Policy file (for ``seeupo exact --policy``)::

    {"action_probs": [<N_t x A_t>, ...]}                # one per turn, rows sum to 1

Validation is strict: every field is type-checked (a number given as a string, or a boolean
where a number goes, is an error), unknown fields are errors, and every problem raises
:class:`InstanceError` (an :class:`seeupo.validation.errors.InputError`) naming the file and field.

Limits (chosen so that a bad file fails in well under a second instead of hanging):

* the JSON limits of :mod:`seeupo.validation.files` (64 MiB, nesting 64 deep, integer literals of at
  most 30 digits, no NaN or Infinity);
* :data:`MAX_CELLS` (10**7): the total number of table entries (``sum_t N_t * A_t * O_t``),
  computed from the shape fields before any table is read; ``max_cells=`` (``seeupo exact
  --max-cells``) raises it;
* :data:`MAX_ABS_VALUE` (1e9): the largest reward magnitude (and ``reward_noise``), so that
  values, advantages and every number ``seeupo`` prints stay finite;
* ``tokens``: ``vocab_size`` at most 2**20 and ``length`` at most 64, with ``vocab_size**length``
  at most :data:`MAX_CELLS` actions; ``end_token`` one of its tokens. A policy file gives
  probability 0 to an action spelled with a nonzero token after its end token (impossible).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seeupo.tabular.problems import DTYPE, TreeMDP, sequential_bandit
from seeupo.validation.errors import InputError
from seeupo.validation.files import MAX_FILE_BYTES, read_json
from seeupo.validation.schemas import check_keys, float_field, int_field, is_number, table_cells

Tensor = torch.Tensor
KINDS = ("sequential_bandit", "tree_mdp")
MAX_CELLS = 10**7
MAX_ABS_VALUE = 1e9
_OPTIONAL = {"tokens", "reward_noise"}
_FIELDS = {
    "sequential_bandit": ({"kind", "initial_state_probs", "actions_per_turn", "rewards"}, _OPTIONAL),
    "tree_mdp": (
        {"kind", "initial_state_probs", "actions_per_turn", "observations_per_turn", "observation_probs", "rewards", "terminal"},
        _OPTIONAL | {"gamma"},
    ),
}


# A malformed instance or policy file; ``str(err)`` is one line naming the file and field. The
# same class as every other input error (the name is kept for callers that catch it).
InstanceError = InputError


def _array(data: dict[str, Any], field: str, shape: tuple[int, ...] | None = None, *, dtype=float) -> np.ndarray:
    """The nested list ``data[field]`` as an array of ``shape``: numbers (or booleans for ``dtype=bool``), no coercion."""
    if field not in data:
        raise InstanceError(field, "missing")
    try:
        arr = np.array(data[field], dtype=object)
    except ValueError:
        raise InstanceError(field, "must be a rectangular nested list") from None
    if shape is not None and arr.shape != shape:
        raise InstanceError(field, f"expected shape {list(shape)}, got {list(arr.shape)}")
    if dtype is bool:
        if not all(isinstance(x, bool) for x in arr.flat):
            raise InstanceError(field, "must hold only true and false")
        return arr.astype(bool)
    if not all(is_number(x) for x in arr.flat):
        raise InstanceError(field, "must hold only finite numbers (not NaN, strings, booleans or null)")
    arr = arr.astype(float)
    if (np.abs(arr) > MAX_ABS_VALUE).any():
        raise InstanceError(field, f"holds a magnitude above {MAX_ABS_VALUE:g}")
    return arr


def _probabilities(arr: np.ndarray, field: str) -> None:
    if (arr < 0).any():
        raise InstanceError(field, "probabilities must be non-negative")
    sums = arr.sum(-1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        raise InstanceError(field, f"probabilities must sum to 1 (found a sum of {float(sums.flat[np.argmax(np.abs(sums - 1))]):.6g})")


def _positive_ints(data: dict[str, Any], field: str, length: int | None = None) -> tuple[int, ...]:
    value = data.get(field)
    if not isinstance(value, list) or not value or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in value):
        raise InstanceError(field, "must be a non-empty list of positive integers")
    if length is not None and len(value) != length:
        raise InstanceError(field, f"expected {length} entries, got {len(value)}")
    if len(value) > 64 or any(x > MAX_CELLS for x in value):
        raise InstanceError(field, f"at most 64 turns of at most {MAX_CELLS} each")
    return tuple(value)


def _tokens(data: dict[str, Any], actions: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...] | None, int | None]:
    """The per-turn token spelling and the end token (``None`` each where the file gives none)."""
    if "tokens" not in data:
        return None, None
    spec = data["tokens"]
    if not isinstance(spec, dict):
        raise InstanceError("tokens", 'must be {"vocab_size": V, "length": L} (and optionally "end_token": k)')
    check_keys(spec, {"vocab_size", "length"}, {"end_token"}, where="tokens")
    v = int_field(spec["vocab_size"], "tokens.vocab_size", 1, 2**20)
    length = int_field(spec["length"], "tokens.length", 1, 64)
    if length * math.log(v) > math.log(MAX_CELLS):
        raise InstanceError("tokens", f"{length} tokens from a vocabulary of {v} spell more than {MAX_CELLS} actions")
    if any(a != v**length for a in actions):
        raise InstanceError("tokens", f"{length} tokens from a vocabulary of {v} spell {v**length} actions; every actions_per_turn entry must equal it")
    end = int_field(spec["end_token"], "tokens.end_token", 0, v - 1) if "end_token" in spec else None
    return tuple((v, length) for _ in actions), end


def _scalar(data: dict[str, Any], field: str, default: float, low: float, high: float) -> float:
    return float_field(data.get(field, default), field, low, high)


def _check_size(cells: int, max_cells: int) -> None:
    if cells > max_cells:
        raise InstanceError("actions_per_turn", f"the instance has {cells} table entries, more than the limit of {max_cells} (max_cells=, seeupo exact --max-cells)")


def problem_from_dict(data: Any, max_cells: int = MAX_CELLS) -> TreeMDP:
    """Validate a parsed instance file and build the (single-instance) problem.

    Shapes are checked against ``max_cells`` (see the module docstring) before any table is read.
    """
    if not isinstance(data, dict):
        raise InstanceError(None, "the file must hold a JSON object")
    kind = data.get("kind")
    if kind not in KINDS:
        raise InstanceError("kind", f"unknown kind {kind!r}; expected one of {list(KINDS)}")
    check_keys(data, *_FIELDS[kind])
    if not isinstance(data["initial_state_probs"], list) or not 1 <= len(data["initial_state_probs"]) <= max_cells:
        raise InstanceError("initial_state_probs", f"must be a flat list of 1 to {max_cells} probabilities")
    rho = _array(data, "initial_state_probs")
    if rho.ndim != 1 or rho.size == 0:
        raise InstanceError("initial_state_probs", "must be a non-empty flat list")
    _probabilities(rho, "initial_state_probs")
    actions = _positive_ints(data, "actions_per_turn")
    tokens, end_token = _tokens(data, actions)
    noise = _scalar(data, "reward_noise", 0.0, 0.0, MAX_ABS_VALUE)
    if kind == "sequential_bandit":
        _check_size(table_cells(rho.size, actions), max_cells)
        rewards = _array(data, "rewards", (rho.size, *actions))
        problem = sequential_bandit(torch.tensor(rho, dtype=DTYPE), actions, torch.tensor(rewards, dtype=DTYPE),
                                    tokens=tokens, reward_noise=noise)
        return dataclasses.replace(problem, end_token=end_token)

    obs = _positive_ints(data, "observations_per_turn", len(actions))
    _check_size(table_cells(rho.size, actions, obs), max_cells)
    gamma = _scalar(data, "gamma", 1.0, 0.0, 1.0)
    tables: dict[str, list[Tensor]] = {}
    for field in ("observation_probs", "rewards", "terminal"):
        per_turn = data.get(field)
        if not isinstance(per_turn, list) or len(per_turn) != len(actions):
            raise InstanceError(field, f"must be a list with one table per turn ({len(actions)})")
        tables[field] = []
        n = rho.size
        for t, (a, o) in enumerate(zip(actions, obs)):
            name = f"{field}[{t}]"
            if field == "terminal":
                arr = _array({name: per_turn[t]}, name, (n, a, o), dtype=bool)
                if t == len(actions) - 1 and not arr.all():
                    raise InstanceError(name, "every episode must end at the last turn (all true)")
                tables[field].append(torch.tensor(arr)[None])
            else:
                arr = _array({name: per_turn[t]}, name, (n, a, o))
                if field == "observation_probs":
                    _probabilities(arr, name)
                tables[field].append(torch.tensor(arr, dtype=DTYPE)[None])
            n *= a * o
    return TreeMDP(
        torch.tensor(rho, dtype=DTYPE)[None], actions, obs, tables["observation_probs"], tables["rewards"],
        tables["terminal"], gamma, tokens, noise, end_token,
    )


def max_file_bytes(max_cells: int) -> int:
    """The file size limit that goes with ``max_cells`` (about 40 bytes of JSON per entry)."""
    return max(MAX_FILE_BYTES, 40 * max_cells)


def load_problem(path: str | Path, max_cells: int = MAX_CELLS) -> TreeMDP:
    """Read and validate an instance file; errors name the file and the field."""
    try:
        return problem_from_dict(read_json(path, max_file_bytes(max_cells)), max_cells)
    except InputError as err:
        raise err.in_file(path) from None


def problem_to_dict(problem: TreeMDP, instance: int = 0) -> dict[str, Any]:
    """One instance as a JSON-ready dict (``sequential_bandit`` when it is one, else ``tree_mdp``)."""
    p = problem.instance(instance)
    out: dict[str, Any] = {"initial_state_probs": p.initial_state_probs[0].tolist(), "actions_per_turn": list(p.actions_per_turn)}
    is_bandit = (
        all(o == 1 for o in p.obs_per_turn)
        and all(not bool(x.any()) for x in p.terminal[:-1])
        and all(not bool(x.any()) for x in p.rewards[:-1])
        and p.gamma == 1.0
    )
    if is_bandit:
        out["kind"] = "sequential_bandit"
        out["rewards"] = p.rewards[-1][0].reshape(p.num_initial_states, *p.actions_per_turn).tolist()
    else:
        out["kind"] = "tree_mdp"
        out["observations_per_turn"] = list(p.obs_per_turn)
        out["observation_probs"] = [x[0].tolist() for x in p.obs_probs]
        out["rewards"] = [x[0].tolist() for x in p.rewards]
        out["terminal"] = [x[0].tolist() for x in p.terminal]
        out["gamma"] = p.gamma
    vocab, length = p.tokens[0]
    if length > 1:
        out["tokens"] = {"vocab_size": vocab, "length": length}
        if p.end_token is not None:
            out["tokens"]["end_token"] = p.end_token
    if p.reward_noise:
        out["reward_noise"] = p.reward_noise
    return out


def policy_from_dict(data: Any, problem: TreeMDP) -> list[Tensor]:
    """Validate a policy file against ``problem`` (one instance); per turn ``[1, N_t, A_t]``."""
    if not isinstance(data, dict) or not isinstance(data.get("action_probs"), list):
        raise InstanceError("action_probs", "the policy file must hold {\"action_probs\": [<N_t x A_t>, ...]}")
    check_keys(data, {"action_probs"})
    tables = data["action_probs"]
    if len(tables) != problem.num_turns:
        raise InstanceError("action_probs", f"expected one table per turn ({problem.num_turns}), got {len(tables)}")
    out = []
    for t, a in enumerate(problem.actions_per_turn):
        name = f"action_probs[{t}]"
        arr = _array({name: tables[t]}, name, (problem.num_histories(t), a))
        _probabilities(arr, name)
        impossible = (~problem.possible_actions(t)).nonzero().squeeze(1).tolist()
        played = [k for k in impossible if arr[:, k].any()]
        if played:
            raise InstanceError(name, f"action {played[0]} is impossible (a nonzero token after the end token "
                                      f"{problem.end_token}) but has positive probability")
        out.append(torch.tensor(arr, dtype=DTYPE)[None])
    return out


def load_policy(path: str | Path, problem: TreeMDP, max_cells: int = MAX_CELLS) -> list[Tensor]:
    """Read and validate a policy file for ``problem``; errors name the file and the field."""
    try:
        return policy_from_dict(read_json(path, max_file_bytes(max_cells)), problem)
    except InputError as err:
        raise err.in_file(path) from None
