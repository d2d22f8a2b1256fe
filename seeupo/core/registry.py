"""Registries of the algorithm's interchangeable pieces: advantage estimators, policy losses,
aggregations, KL estimators, rollout corrections, and the sequential schedule's turn orders and ``M`` factors.

An algorithm of this toolkit names its pieces (``AlgorithmConfig.advantage``, ``.update``,
``.aggregation``, ``.kl_estimator``, ``.correction``, ``.order``, ``.m_factor``); each name is an entry of a registry here. A new
piece is one decorated function, as in verl (``register_adv_est``, ``register_policy_loss``) and rlax::

    @register_adv_est("median_baseline", needs_group_stats=True)
    def median_baseline(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
        ...  # [n, L] per-token advantages

after which ``AlgorithmConfig(advantage="median_baseline")`` is valid and
:func:`seeupo.core.update.compute_advantages` calls it. The registries are the one place that
lists the allowed choices: configuration validation, error messages and ``seeupo presets``
read them.

Signatures (tensors are torch tensors; ``batch`` a :class:`seeupo.core.batch.SampleBatch`):

* advantage estimator: ``fn(batch, cfg, *, critic_values, oracle, group_stats) -> [n, L]``,
  the per-token advantage aligned with ``batch.logp_old``, 0 on padding and placeholder rows;
  ``cfg`` is the :class:`~seeupo.core.config.AlgorithmConfig` (its own options ride on it).
* policy loss: ``fn(logp_new, batch, adv, cfg) -> (objective, clipped)``, the per-token
  objective ``[n, L]`` to **maximise** (differentiable in ``logp_new``) and a per-token bool
  ``[n, L]`` of clipped ratios (or ``None`` when the loss does not clip); ``cfg`` is the
  :class:`~seeupo.core.config.AlgorithmConfig` (``ratio_level``, ``clip_eps_low``, ... ride on it). The
  aggregation over tokens is not the loss's business: :func:`seeupo.core.losses.policy_objective`
  applies the configured one, so that micro-batches add up exactly.
* aggregation: ``fn(n_tokens, weight) -> (per_row, den_terms)`` over the valid rows of a
  minibatch, ``n_tokens`` their real token counts and ``weight`` their row weights (0 on
  placeholders): the aggregate is ``sum_i per_row_i * sum_j x_ij / sum_{k in instance} den_terms_k``
  (see :func:`seeupo.core.losses.row_coefficients`).
* KL estimator: ``fn(logp, logp_ref) -> [n, L]``, a per-token estimate of ``KL(pi || pi_ref)`` from
  tokens sampled from the policy, ``logp`` their log-probabilities under it (differentiable) and
  ``logp_ref`` under the reference (Schulman 2020's ``k1``, ``k2``, ``k3``). Where it sits
  (``AlgorithmConfig.kl_placement``) decides which gradient its expectation gives:
  :func:`seeupo.core.losses.kl_term` and :mod:`seeupo.tabular.kl`.
* rollout correction: ``fn(batch, cfg) -> [n, L]``, a weight ``>= 0`` per token (0 masks it) for rows
  sampled from a behaviour policy (``batch.logp_behaviour``) other than the one ``batch.logp_old``
  scores; it multiplies the token's advantage, carries no gradient, and is 1 where the two agree
  (:mod:`seeupo.core.corrections`).
* turn order: ``fn(num_turns, cfg, generator) -> list[int]``, the order in which a sequential
  update visits the turns, a permutation of ``0..num_turns-1``; random draws come from
  ``generator`` (a CPU ``torch.Generator`` or ``None``).
* ``M`` factor: ``fn(factor, ratio, cfg) -> new factor``, how one turn's ratio enters the running
  factor ``F[traj]`` of the sequential weights ``M_t = A * F[traj]`` (docs/method.md §4). ``factor`` is
  ``[k]``, the current ``F`` of the ``k`` trajectories of the turn just updated (the advantages'
  dtype); ``ratio`` is ``[k]``, their ``pi_new(a_t|h_t) / pi_old(a_t|h_t)`` (the log-probabilities'
  dtype, 1 on placeholder rows); the result is their new ``F`` in ``factor``'s dtype. ``F`` starts
  at 1. An entry registered with ``uses_ratio=False`` is never called: ``F`` stays 1 and no ratio is
  computed.

Every call of a registered function goes through :mod:`seeupo.core.boundary`, which checks its
result (type, shape, dtype, device, finite values, gradient, the batch left unchanged) and names
the function and the file and line where it was registered when something is wrong.

This module imports no torch; it imports :mod:`seeupo.core.builtins` (the paper's choices, which
import nothing from here) and registers them first, so that a user's entry can never take a
built-in's name. The built-ins import their implementations when called, so that validating a
configuration and ``--help`` stay light.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

import seeupo.core.builtins as builtins

F = TypeVar("F", bound=Callable[..., Any])
E = TypeVar("E", bound="Entry")


@dataclass(frozen=True)
class Entry:
    """A registered function under its name; each kind below adds what the core needs to know about it."""

    name: str
    fn: Callable[..., Any]

    @property
    def doc(self) -> str:
        return _first_line(self.fn)

    @property
    def where(self) -> str:
        """``FILE:LINE`` where the function was defined (its decorator's line): what error messages point to."""
        return _source(self.fn)

    @property
    def builtin(self) -> bool:
        """A function of the toolkit itself: an exception it raises is a toolkit bug and keeps its traceback."""
        return getattr(self.fn, "__module__", "").startswith("seeupo.")


@dataclass(frozen=True)
class AdvantageEstimator(Entry):
    """A registered advantage estimator and what it needs.

    needs_critic: the caller must pass ``critic_values`` (a value model is trained alongside).
    needs_oracle: the caller must pass ``oracle``, the exact advantages (tabular engine only).
    needs_group_stats: the estimator compares a trajectory with the other rollouts of its task,
      so a configuration needs ``group_size >= 2``.
    exact: the tabular exact mode may compute its expectation (``False``: exact mode refuses it in
      one line; the sampled mode still runs it). Exact mode calls a non-group estimator on every
      path once, weighted by its probability, and a group estimator on groups built by enumerating
      the group-mates' outcomes (:func:`seeupo.tabular.rollout.exact_group_batch`): each group holds
      one trajectory weighted by its probability times that of its group-mates' configuration, and
      ``group_size - 1`` group-mates of weight 0. That is exact only under the assumptions below;
      each is checked before exact cells run (:func:`seeupo.core.contract.exact_mode_refusal`, on
      random batches, to 1e-12), and an estimator that fails one is refused for exact mode with the
      reason, whatever it declared:

      1. deterministic: two calls on the same batch give the same advantages
         (refusal: "not deterministic");
      2. symmetric in its group: permuting the trajectories within their groups (their rows and
         their ids) permutes the advantages with them; no trajectory is special for being first
         (refusal: "not symmetric in its group"); a non-group estimator likewise may not depend on
         a trajectory's position in the batch;
      3. blind to its group-mates' actions, histories and log-probabilities: a group-mate stands
         for its whole outcome class (per-turn rewards, returns, ``valid``; with ``reads_histories``
         also its histories ``batch.data["hist"]``), so changing a group-mate's actions, histories
         (unless ``reads_histories``) or ``logp_old`` leaves the other trajectories' advantages as
         they were (refusal: "reads its group-mates' actions, histories or log-probabilities");
      4. weights as exact mode does: every group member counts once in group statistics (weights
         ignored), and any batch-level statistic (a batch mean or std, a fraction of groups) is
         weighted by ``batch.weight`` (1 everywhere when sampled): a batch holding each group once
         per member, that member weighted ``m`` and its group-mates 0, gives each member the
         advantage it gets in a batch holding its group ``m`` times with weight 1
         (refusal: "does not weight the batch as exact mode does").

      Every call, in every mode, is also checked at the boundary (:mod:`seeupo.core.boundary`):
      a ``[n, L]`` floating tensor on the batch's device, finite on valid tokens, the batch unchanged.
      In the language-model trainer an estimator that reads ``batch.logp_old`` reads the policy's
      rescored log-probabilities, except before an update of one optimizer step
      (:func:`seeupo.core.update.is_on_policy`), which scores them in its own passes: there it reads
      the rollout engine's log-probabilities of the same tokens under the same weights.
    reads_histories: the estimator reads its group-mates' histories ``batch.data["hist"]`` (the
      environment states they passed through; e.g. GiGPO groups the steps of a group by state):
      exact mode then tells group-mates apart by their whole path (histories, rewards, ends), not
      only by their rewards and ends, which makes more classes and more rows.
    group_stats_closed_form: the estimator also accepts ``group_stats = (group_sum, group_sumsq)``
      per trajectory, the sufficient statistics of an exact distribution over group-mates (GRAE's
      closed form): exact mode then enumerates those statistics instead of the group-mates'
      outcomes, a fast path that the generic enumeration checks (tests/tabular/test_rollout.py).
    tabular, lm: usable by the tabular engine / the language-model trainer.
    """

    needs_critic: bool = False
    needs_oracle: bool = False
    needs_group_stats: bool = False
    exact: bool = True
    reads_histories: bool = False
    group_stats_closed_form: bool = False
    tabular: bool = True
    lm: bool = True


@dataclass(frozen=True)
class PolicyLoss(Entry):
    """A registered policy loss and what it supports.

    surrogate: the loss is a function of the ratio ``pi / pi_old`` (it reads ``ratio_level``,
      ``ratio_scope``, ``length_norm`` and the clip settings of the configuration) and stays
      valid over several epochs on one batch; ``False``: a plain policy-gradient objective
      (``log pi * A``) meant for one gradient step per batch.
    """

    surrogate: bool = True


@dataclass(frozen=True)
class Aggregation(Entry):
    """A registered aggregation of per-token values into one number per instance."""


@dataclass(frozen=True)
class KlEstimator(Entry):
    """A registered per-token estimator of ``KL(pi || pi_ref)`` (``AlgorithmConfig.kl_estimator``)."""


@dataclass(frozen=True)
class RolloutCorrection(Entry):
    """A registered rollout correction (``AlgorithmConfig.correction``; :mod:`seeupo.core.corrections`)."""


@dataclass(frozen=True)
class TurnOrder(Entry):
    """A registered order of a sequential update's turns (``AlgorithmConfig.order``)."""


@dataclass(frozen=True)
class MFactor(Entry):
    """A registered rule for the running factor ``F`` of the sequential weights (``AlgorithmConfig.m_factor``).

    uses_ratio: the rule reads each turn's ratio; ``False``: ``F`` stays 1 (``M = A``), the rule is
      never called and the update makes no ratio pass.
    """

    uses_ratio: bool = True


class NameClash(ValueError):
    """A name registered twice: raised by :meth:`Registry.add` so that a plugin loader can tell it
    from an error inside the plugin's own code."""


class Registry(Generic[E]):
    """Named entries of one kind; a name is registered once."""

    def __init__(self, kind: str, field: str, entry: type[E]) -> None:
        self.kind = kind  # "advantage estimator", ...
        self.field = field  # the AlgorithmConfig field naming an entry
        self.entry = entry  # the entry type: entry(name, fn, **options)
        self._entries: dict[str, E] = {}

    def register(self, name: str, **options: Any) -> Callable[[F], F]:
        """A decorator registering its function as entry ``name``; ``options``: the entry type's other fields."""
        allowed = [f.name for f in dataclasses.fields(self.entry) if f.name not in ("name", "fn")]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise TypeError(f"a {self.kind} has no option {', '.join(map(repr, unknown))}; its options: {allowed}")

        def decorate(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"{self.kind} {name!r}: can only register a function, got {type(fn).__name__}")
            self.add(name, self.entry(name, fn, **options))
            return fn

        return decorate

    def add(self, name: str, entry: E) -> None:
        """Register ``entry`` under ``name``; a clash with an existing entry is an error (never a silent override)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        if name in self._entries:
            raise NameClash(f"{self.kind} {name!r} is already registered (by {_where(self._entries[name].fn)}); "
                            "choose another name")
        self._entries[name] = entry

    def remove(self, name: str) -> None:
        """Unregister ``name`` (tests and interactive sessions that redefine an entry)."""
        self.get(name)
        del self._entries[name]

    def get(self, name: str) -> E:
        """The entry ``name``; an unknown name is a one-line error listing the registered ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"AlgorithmConfig.{self.field}={name!r} is not a registered {self.kind}; expected one of {self.names()}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order (built-ins first)."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", "advantage", AdvantageEstimator)
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "update", PolicyLoss)
AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation", "aggregation", Aggregation)
KL_ESTIMATORS: Registry[KlEstimator] = Registry("KL estimator", "kl_estimator", KlEstimator)
ROLLOUT_CORRECTIONS: Registry[RolloutCorrection] = Registry("rollout correction", "correction", RolloutCorrection)
TURN_ORDERS: Registry[TurnOrder] = Registry("turn order", "order", TurnOrder)
M_FACTORS: Registry[MFactor] = Registry("M factor", "m_factor", MFactor)


def register_adv_est(name: str, **options: Any) -> Callable[[F], F]:
    """Register the decorated function as the advantage estimator ``name``; ``options``: ``needs_critic``,
    ``needs_oracle``, ``needs_group_stats``, ``exact``, ``reads_histories``, ``group_stats_closed_form``,
    ``tabular``, ``lm`` (see :class:`AdvantageEstimator`)."""
    return ADV_ESTIMATORS.register(name, **options)


def register_policy_loss(name: str, **options: Any) -> Callable[[F], F]:
    """Register the decorated function as the policy loss ``name`` (``AlgorithmConfig.update``); ``options``:
    ``surrogate`` (see :class:`PolicyLoss`)."""
    return POLICY_LOSSES.register(name, **options)


def register_aggregation(name: str) -> Callable[[F], F]:
    """Register the decorated function as the loss aggregation ``name`` (see the module docstring)."""
    return AGGREGATIONS.register(name)


def register_kl_estimator(name: str) -> Callable[[F], F]:
    """Register the decorated function as the KL estimator ``name`` (``AlgorithmConfig.kl_estimator``; module
    docstring)."""
    return KL_ESTIMATORS.register(name)


def register_rollout_correction(name: str) -> Callable[[F], F]:
    """Register the decorated function as the rollout correction ``name`` (``AlgorithmConfig.correction``; module
    docstring)."""
    return ROLLOUT_CORRECTIONS.register(name)


def register_turn_order(name: str) -> Callable[[F], F]:
    """Register the decorated function as the turn order ``name`` (``AlgorithmConfig.order``; module docstring)."""
    return TURN_ORDERS.register(name)


def register_m_factor(name: str, **options: Any) -> Callable[[F], F]:
    """Register the decorated function as the ``M`` factor ``name`` (``AlgorithmConfig.m_factor``); ``options``:
    ``uses_ratio`` (see :class:`MFactor`)."""
    return M_FACTORS.register(name, **options)


def adv_estimator(name: str) -> AdvantageEstimator:
    return ADV_ESTIMATORS.get(name)


def policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES.get(name)


def aggregation(name: str) -> Aggregation:
    return AGGREGATIONS.get(name)


def kl_estimator(name: str) -> KlEstimator:
    return KL_ESTIMATORS.get(name)


def rollout_correction(name: str) -> RolloutCorrection:
    return ROLLOUT_CORRECTIONS.get(name)


def _first_line(fn: Callable[..., Any]) -> str:
    return (fn.__doc__ or "").strip().split("\n")[0]


def _where(fn: Callable[..., Any]) -> str:
    """``module.qualname (FILE:LINE)``: a registered function, for a name clash."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))} ({_source(fn)})"


def _source(fn: Callable[..., Any]) -> str:
    """``FILE:LINE`` of ``fn``'s definition: relative to the working directory when below it, the toolkit's own
    files from the package's folder (``seeupo/core/builtins.py:40``), else as Python knows the file."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:  # a callable object, a builtin function
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    return f"{shown_path(code.co_filename)}:{code.co_firstlineno}"


_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shown_path(filename: str) -> str:
    """A source file as messages show it: relative to the working directory when below it, a toolkit file
    relative to the folder holding the ``seeupo`` package, else unchanged."""
    path = os.path.abspath(filename)
    for base in (os.getcwd(), _PACKAGE_PARENT):
        if path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return filename


# The paper's choices first, in their order, so that no later entry can take a built-in's name.
for _registry, _table in ((ADV_ESTIMATORS, builtins.ADV_ESTIMATORS), (POLICY_LOSSES, builtins.POLICY_LOSSES),
                          (AGGREGATIONS, builtins.AGGREGATIONS), (KL_ESTIMATORS, builtins.KL_ESTIMATORS),
                          (ROLLOUT_CORRECTIONS, builtins.ROLLOUT_CORRECTIONS), (TURN_ORDERS, builtins.TURN_ORDERS),
                          (M_FACTORS, builtins.M_FACTORS)):
    for _name, _fn, _options in _table:
        _registry.register(_name, **_options)(_fn)
