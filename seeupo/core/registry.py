"""Registries of the algorithm's interchangeable pieces: advantage estimators, policy losses,
aggregations, and the sequential schedule's turn orders and ``M`` factors.

An algorithm of this toolkit names its pieces (``AlgorithmConfig.advantage``, ``.update``,
``.aggregation``, ``.order``, ``.m_factor``); each name is an entry of a registry here. A new
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
* policy loss: ``fn(logp_new, batch, adv, settings) -> (objective, clipped)``, the per-token
  objective ``[n, L]`` to **maximise** and a per-token bool ``[n, L]`` of clipped ratios (or
  ``None`` when the loss does not clip); ``settings`` is a :class:`LossSettings`. The
  aggregation over tokens is not the loss's business: :func:`seeupo.core.losses.policy_objective`
  applies the configured one, so that micro-batches add up exactly.
* aggregation: ``fn(n_tokens, weight) -> (per_row, den_terms)`` over the valid rows of a
  minibatch, ``n_tokens`` their real token counts and ``weight`` their row weights (0 on
  placeholders): the aggregate is ``sum_i per_row_i * sum_j x_ij / sum_{k in instance} den_terms_k``
  (see :func:`seeupo.core.losses.row_coefficients`).
* turn order: ``fn(num_turns, cfg, generator) -> list[int]``, the order in which a sequential
  update visits the turns, a permutation of ``0..num_turns-1``; random draws come from
  ``generator`` (a CPU ``torch.Generator`` or ``None``).
* ``M`` factor: ``fn(factor, ratio, cfg) -> new factor``, how one turn's ratio enters the running
  factor ``F[traj]`` of the sequential weights ``M_t = A * F[traj]`` (PAPER.md §4). ``factor`` is
  ``[k]``, the current ``F`` of the ``k`` trajectories of the turn just updated (the advantages'
  dtype); ``ratio`` is ``[k]``, their ``pi_new(a_t|h_t) / pi_old(a_t|h_t)`` (the log-probabilities'
  dtype, 1 on placeholder rows); the result is their new ``F`` in ``factor``'s dtype. ``F`` starts
  at 1. An entry registered with ``uses_ratio=False`` is never called: ``F`` stays 1 and no ratio is
  computed.

This module imports no torch: the built-in entries (:mod:`seeupo.core.builtins`) import their
implementations when called, so that validating a configuration and ``--help`` stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
E = TypeVar("E")


@dataclass(frozen=True)
class Entry:
    """A registered function under its name; the kinds below add what the core needs to know about it."""

    name: str
    fn: Callable[..., Any]

    @property
    def doc(self) -> str:
        return _first_line(self.fn)


@dataclass(frozen=True)
class AdvantageEstimator(Entry):
    """A registered advantage estimator and what it needs.

    needs_critic: the caller must pass ``critic_values`` (a value model is trained alongside).
    needs_oracle: the caller must pass ``oracle``, the exact advantages (tabular engine only).
    needs_group_stats: the estimator compares a trajectory with the other rollouts of its task,
      so a configuration needs ``group_size >= 2``.
    exact: the tabular exact mode can compute its expectation. A non-group estimator is called on
      every path once, weighted by its probability. A group estimator is called on groups built by
      enumerating the group-mates' outcomes (:func:`seeupo.tabular.rollout.exact_group_batch`): each
      group holds one trajectory weighted by its probability times that of its group-mates'
      configuration, and ``group_size - 1`` group-mates of weight 0. That is exact when the
      estimator (a) is a symmetric function of its group's outcomes (per-turn rewards, returns,
      ``valid``), reading no group-mate's actions or log-probabilities, (b) counts every group
      member once in group statistics (no weights), and (c) weights any batch-level statistic
      (a batch mean or std, a fraction of groups) by ``batch.weight`` (1 everywhere when sampled).
      ``False``: exact mode refuses it with a one-line message; the sampled mode still runs it.
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
    group_stats_closed_form: bool = False
    tabular: bool = True
    lm: bool = True


@dataclass(frozen=True)
class PolicyLoss(Entry):
    """A registered policy loss and what it supports.

    surrogate: the loss is a function of the ratio ``pi / pi_old`` (it reads ``ratio_level``,
      ``ratio_scope``, ``length_norm`` and the clip settings of :class:`LossSettings`) and stays
      valid over several epochs on one batch; ``False``: a plain policy-gradient objective
      (``log pi * A``) meant for one gradient step per batch.
    """

    surrogate: bool = True


@dataclass(frozen=True)
class Aggregation(Entry):
    """A registered aggregation of per-token values into one number per instance."""


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


@dataclass(frozen=True)
class LossSettings:
    """The settings a policy loss may read, taken from an :class:`~seeupo.core.config.AlgorithmConfig`.

    A separate object (not the whole configuration) so that the losses can be called from the
    keyword arguments of :func:`seeupo.core.losses.policy_objective` as well.
    """

    ratio_level: str = "token"
    ratio_scope: str = "turn"
    length_norm: bool = True
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None


class NameClash(ValueError):
    """A name registered twice: raised by :meth:`Registry.add` so that a plugin loader can tell it
    from an error inside the plugin's own code."""


class Registry(Generic[E]):
    """Named entries of one kind; a name is registered once."""

    def __init__(self, kind: str, field: str, entry: Callable[..., E]) -> None:
        self.kind = kind  # "advantage estimator", ...
        self.field = field  # the AlgorithmConfig field naming an entry
        self.entry = entry  # the entry type: entry(name, fn, **options)
        self._entries: dict[str, E] = {}

    def register(self, name: str, **options: Any) -> Callable[[F], F]:
        """A decorator registering its function as entry ``name``; ``options``: the entry type's other fields."""

        def decorate(fn: F) -> F:
            self.add(name, self.entry(name, fn, **options))
            return fn

        return decorate

    def add(self, name: str, entry: E) -> None:
        """Register ``entry`` under ``name``; a clash with an existing entry is an error (never a silent override)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        if name in self._entries:
            existing = self._entries[name].fn  # type: ignore[attr-defined]
            raise NameClash(f"{self.kind} {name!r} is already registered (by {_where(existing)}); choose another name")
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
TURN_ORDERS: Registry[TurnOrder] = Registry("turn order", "order", TurnOrder)
M_FACTORS: Registry[MFactor] = Registry("M factor", "m_factor", MFactor)


def register_adv_est(
    name: str,
    *,
    needs_critic: bool = False,
    needs_oracle: bool = False,
    needs_group_stats: bool = False,
    exact: bool = True,
    group_stats_closed_form: bool = False,
    tabular: bool = True,
    lm: bool = True,
) -> Callable[[F], F]:
    """Register the decorated function as the advantage estimator ``name`` (see :class:`AdvantageEstimator`)."""
    return ADV_ESTIMATORS.register(
        name, needs_critic=needs_critic, needs_oracle=needs_oracle, needs_group_stats=needs_group_stats, exact=exact,
        group_stats_closed_form=group_stats_closed_form, tabular=tabular, lm=lm,
    )


def register_policy_loss(name: str, *, surrogate: bool = True) -> Callable[[F], F]:
    """Register the decorated function as the policy loss ``name`` (``AlgorithmConfig.update``; see :class:`PolicyLoss`)."""
    return POLICY_LOSSES.register(name, surrogate=surrogate)


def register_aggregation(name: str) -> Callable[[F], F]:
    """Register the decorated function as the loss aggregation ``name`` (see the module docstring)."""
    return AGGREGATIONS.register(name)


def register_turn_order(name: str) -> Callable[[F], F]:
    """Register the decorated function as the turn order ``name`` (``AlgorithmConfig.order``; module docstring)."""
    return TURN_ORDERS.register(name)


def register_m_factor(name: str, *, uses_ratio: bool = True) -> Callable[[F], F]:
    """Register the decorated function as the ``M`` factor ``name`` (``AlgorithmConfig.m_factor``; :class:`MFactor`)."""
    return M_FACTORS.register(name, uses_ratio=uses_ratio)


def adv_estimator(name: str) -> AdvantageEstimator:
    return ADV_ESTIMATORS.get(name)


def policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES.get(name)


def aggregation(name: str) -> Aggregation:
    return AGGREGATIONS.get(name)


def _first_line(fn: Callable[..., Any]) -> str:
    return (fn.__doc__ or "").strip().split("\n")[0]


def _where(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# The paper's choices, registered last so that they can use the decorators above.
import seeupo.core.builtins  # noqa: E402,F401
