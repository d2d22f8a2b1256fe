"""The algorithm configuration and the presets that name the paper's Table 1 rows.

Every algorithm of the paper is a point in one space: an advantage estimator, a policy
update, a ratio level, and a schedule. Any other point can be composed by hand::

    cfg = AlgorithmConfig(advantage="grae", grae_scale="group_std", update="ppo",
                          ratio_level="sequence", schedule="sequential", order="forward")

The advantage estimator, the policy loss (``update``), the aggregation, the turn order and the ``M``
factor are names of registry entries (:mod:`seeupo.core.registry`), so a new one is a decorated
function, not an edit here.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Literal, get_args

from seeupo.core.registry import (
    ADV_ESTIMATORS,
    AGGREGATIONS,
    KL_ESTIMATORS,
    M_FACTORS,
    POLICY_LOSSES,
    ROLLOUT_CORRECTIONS,
    TURN_ORDERS,
    NameClash,
    Registry,
    adv_estimator,
)

# The closed choices of the fields that are not registries: each list is spelled once, here, and
# validation and error messages read it (``get_args``). The open choices (``advantage``,
# ``update``, ``aggregation``, ``order``, ``m_factor``) are the registries of :mod:`seeupo.core.registry`.
GraeCenter = Literal["mean", "loo", "none"]
GraeScale = Literal["none", "group_std", "batch_std"]
RatioLevel = Literal["token", "sequence"]
RatioScope = Literal["turn", "trajectory"]
AggregationRows = Literal["turn", "trajectory"]
KlPlacement = Literal["loss", "loss_is", "reward"]
Schedule = Literal["simultaneous", "sequential"]
MAlignment = Literal["trajectory", "shuffled"]


@dataclass(frozen=True)
class AlgorithmConfig:
    """One multi-turn policy-optimisation algorithm.

    Naming
      name: what the run is called in saved configs, metrics and figures; it must say what ran
        (see :func:`preset`).
      preset: the preset this configuration was derived from (``None``: composed by hand), so
        that a saved configuration names its starting point as well as what ran.

    Advantage estimation
      advantage: a registered advantage estimator (:func:`seeupo.core.registry.register_adv_est`);
        built in: ``"oracle"`` (exact advantages supplied by the caller), ``"gae"`` (critic,
        Schulman et al. 2016) or ``"grae"`` (group relative, critic-free; docs/method.md §2).
      gae_gamma, gae_lambda: GAE's discount and trace parameter.
      gae_token_level: GAE steps are tokens (PPO on LLMs) rather than turns.
      group_size: ``G``, rollouts per task for GRAE (any estimator that needs group statistics).
      grae_center: ``"mean"`` (GRPO, Shao et al. 2024), ``"loo"`` (RLOO, Kool et al. 2019) or ``"none"``.
      grae_scale: ``"none"``, ``"group_std"`` (GRPO) or ``"batch_std"`` (batch z-score: SeeUPO,
        REINFORCE++ of Hu 2025).
      grae_clamp: clip advantages to ``[-c, c]`` after scaling; ``None`` for no clamping.

    Policy update
      update: a registered policy loss (:func:`seeupo.core.registry.register_policy_loss`); built
        in: ``"reinforce"`` (one gradient step on ``log pi * A``) or ``"ppo"`` (the clipped
        surrogate, "PPU" in the paper).
      ratio_level: ``"token"`` (PPO, GRPO) or ``"sequence"`` (GSPO, Zheng et al. 2025; SeeUPO).
      ratio_scope: the "sequence" of a sequence-level ratio: one turn's response or the whole
        trajectory.
      length_norm: sequence ratio as the geometric mean of token ratios (GSPO) rather than
        the product (the true ``pi(a|h) / pi_old(a|h)``).
      clip_eps_low, clip_eps_high: the clip range ``[1 - low, 1 + high]`` (0.2 in the paper).
      dual_clip: the dual-clip constant of Ye et al. 2020, or ``None``.
      kl_coef, kl_estimator: KL penalty to a reference policy (paper: 0.002 with ``k3``): a registered
        estimator (:func:`seeupo.core.registry.register_kl_estimator`; built in ``k1``, ``k2``, ``k3``).
      kl_placement: where the estimates go: ``"loss"`` (a term of the loss, verl's ``use_kl_loss``),
        ``"loss_is"`` (in the loss, each token's estimate times its ratio ``pi / pi_old``), or
        ``"reward"`` (subtracted from each turn's reward before the advantages, verl's
        ``use_kl_in_reward``); :func:`seeupo.core.losses.kl_term` says which gradient each gives.
      entropy_coef: an entropy bonus: the loss minus this times the entropy of each token's whole
        conditional distribution, aggregated as the objective (verl's ``entropy_coeff``, 0 by default;
        the policy must give ``token_entropies``: the tabular engine's and the language-model policy's do,
        the latter from the same forward passes as the log-probabilities).
      correction: for rows drawn from a behaviour policy other than the one the update's old
        log-probabilities score (``SampleBatch.logp_behaviour``: a stale policy, an inference
        engine's sampler), a registered rollout correction
        (:func:`seeupo.core.registry.register_rollout_correction`; built in: ``none``, ``token_is``,
        ``sequence_is``, ``geometric_is``, ``token_mask``, ``sequence_mask``, ``decoupled``, ``m2po``;
        :mod:`seeupo.core.corrections`). On policy every correction is 1.
      correction_cap, correction_floor: the truncation of an importance weight and the bounds of a
        mask (``[floor, cap]``); m2_tau: M2PO's bound on the mean squared log-ratio.
      aggregation: how token objectives become one number: a registered aggregation
        (:func:`seeupo.core.registry.register_aggregation`; see :func:`seeupo.core.losses.aggregate`).
      aggregation_rows: the rows an aggregation averages over: ``"turn"``, one per (trajectory, turn),
        as this toolkit lays out a batch, or ``"trajectory"``, one per trajectory holding every turn's
        response tokens, as verl's multi-turn agent loop does (its ``loss_agg_mode`` then averages a
        sequence's tokens over the whole trajectory). The same for ``token_mean``; a simultaneous
        schedule only (a sequential one updates one turn's rows at a time).
      epochs, minibatches: passes over the batch and minibatches per pass (per turn, in a
        sequential schedule). The reference code uses 1 and 1 (docs/method.md §5).

    Schedule
      schedule: ``"simultaneous"`` (all turns in one update) or ``"sequential"`` (one turn at
        a time, HAML of Zhong et al. 2024).
      order: a registered turn order (:func:`seeupo.core.registry.register_turn_order`); built in:
        ``"reverse"`` (last turn first: SeeUPO), ``"forward"``, ``"random"`` or ``"custom"``.
      custom_order: the turn order (0-based) when ``order="custom"``.
      m_factor: the sequential weight ``M``, a registered factor rule
        (:func:`seeupo.core.registry.register_m_factor`); built in: ``"none"`` (the plain
        advantage), ``"happo"`` (``M <- M * pi_new / pi_old`` after each turn), or ``"clipped"``
        (each factor and the running product clipped to ``m_clip``, as in the reference code).
      m_clip: the range of the ``"clipped"`` variant.
      m_length_norm: each factor of ``M`` is the geometric mean of the turn's token ratios
        (``exp(mean_j log rho_j)``, like GSPO's ratio) instead of the true sequence ratio
        ``pi_new(a_t|h_t) / pi_old(a_t|h_t)``. The HAML identity (docs/method.md Eq. 4) needs the true
        ratio, and the tabular engine checks that one; but a product of hundreds of token ratios
        over- or underflows on language models, where the normalised factor stays near 1. With
        one-token actions the two coincide.
      m_refresh: before each turn's update, recompute ``M``'s factor from the *current* policy
        (the product over the turns already updated of their current ratio) instead of the
        factor recorded right after each turn's update. With independent per-turn parameters the
        two are equal; with parameters shared across turns (a language model) a later update
        moves the earlier turns' policies too, the recorded factor goes stale, and the refreshed
        one is the ratio HAML's identity asks for. Before each turn it makes a no-grad pass over
        the updated turns' rows, in place of the recorded factor's pass over the last one's.
      m_alignment: ``"trajectory"`` (``M`` keyed by trajectory id: correct) or ``"shuffled"``,
        which reproduces the reference code's defect (docs/method.md §5): ``M`` is positional while
        each turn batch is re-ordered, so every trajectory receives the factor of a random
        other trajectory. For ablations only.
      equal_budget: a sequential update takes as many optimizer steps in total as the
        simultaneous update would (``epochs * minibatches``), split evenly over the ``T`` turns:
        each turn takes ``b = max(1, epochs * minibatches // T)`` steps as ``min(minibatches, b)``
        minibatches (every trajectory seen) for ``b // min(minibatches, b)`` epochs. When
        ``epochs * minibatches < T`` every turn still takes one step.
    """

    name: str = "custom"
    preset: str | None = None
    advantage: str = dataclasses.field(default="grae", metadata={"choices": ADV_ESTIMATORS.names})
    gae_gamma: float = 1.0
    gae_lambda: float = 1.0
    gae_token_level: bool = False
    group_size: int = 4
    grae_center: GraeCenter = "mean"
    grae_scale: GraeScale = "none"
    grae_clamp: float | None = None
    update: str = dataclasses.field(default="ppo", metadata={"choices": POLICY_LOSSES.names})
    ratio_level: RatioLevel = "token"
    ratio_scope: RatioScope = "turn"
    length_norm: bool = True
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = dataclasses.field(default="k3", metadata={"choices": KL_ESTIMATORS.names})
    kl_placement: KlPlacement = "loss"
    entropy_coef: float = 0.0
    correction: str = dataclasses.field(default="none", metadata={"choices": ROLLOUT_CORRECTIONS.names})
    correction_cap: float = 2.0
    correction_floor: float = 0.5
    m2_tau: float = 0.04
    aggregation: str = dataclasses.field(default="token_mean", metadata={"choices": AGGREGATIONS.names})
    aggregation_rows: AggregationRows = "turn"
    epochs: int = 1
    minibatches: int = 1
    schedule: Schedule = "simultaneous"
    order: str = dataclasses.field(default="reverse", metadata={"choices": TURN_ORDERS.names})
    custom_order: tuple[int, ...] | None = None
    m_factor: str = dataclasses.field(default="happo", metadata={"choices": M_FACTORS.names})
    m_clip: tuple[float, float] = (0.8, 1.2)
    m_length_norm: bool = False
    m_refresh: bool = False
    m_alignment: MAlignment = "trajectory"
    equal_budget: bool = False

    def __post_init__(self) -> None:
        for registry in REGISTRIES:
            registry.get(getattr(self, registry.field))  # an unknown name: one line listing the registered ones
        for name, allowed in choices().items():
            if name not in REGISTRY_FIELDS and getattr(self, name) not in allowed:
                raise ValueError(f"AlgorithmConfig.{name}={getattr(self, name)!r}; expected one of {allowed}")
        if self.aggregation_rows == "trajectory" and self.schedule == "sequential":
            raise ValueError("AlgorithmConfig.aggregation_rows='trajectory' needs schedule='simultaneous': a sequential "
                             "update takes one turn's rows at a time, so no row holds a whole trajectory")
        if self.group_size < 2 and adv_estimator(self.advantage).needs_group_stats:
            raise ValueError(
                f"AlgorithmConfig.group_size must be >= 2 for {self.advantage!r} (group statistics), got {self.group_size}"
            )
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError("AlgorithmConfig.epochs and minibatches must be >= 1")
        if self.order == "custom" and self.custom_order is None:
            raise ValueError("AlgorithmConfig.order='custom' needs custom_order")
        if self.custom_order is not None and sorted(self.custom_order) != list(range(len(self.custom_order))):
            raise ValueError(f"AlgorithmConfig.custom_order={self.custom_order} must be a permutation of 0..T-1")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"AlgorithmConfig.dual_clip must be > 1, got {self.dual_clip}")
        if not 0.0 < self.m_clip[0] <= 1.0 <= self.m_clip[1]:
            raise ValueError(f"AlgorithmConfig.m_clip must satisfy 0 < low <= 1 <= high, got {self.m_clip}")
        if self.kl_coef < 0.0:
            raise ValueError(f"AlgorithmConfig.kl_coef must be >= 0, got {self.kl_coef}")
        if not 0.0 < self.correction_floor <= 1.0 <= self.correction_cap:
            raise ValueError("AlgorithmConfig.correction_floor and correction_cap must satisfy 0 < floor <= 1 <= cap "
                             f"(a weight of 1, on policy, is always kept), got {self.correction_floor} and {self.correction_cap}")
        if not self.m2_tau >= 0.0:
            raise ValueError(f"AlgorithmConfig.m2_tau must be >= 0, got {self.m2_tau}")
        if not (0.0 <= self.gae_gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise ValueError("AlgorithmConfig.gae_gamma and gae_lambda must lie in [0, 1]")
        if self.grae_clamp is not None and self.grae_clamp <= 0.0:
            raise ValueError(f"AlgorithmConfig.grae_clamp must be > 0, got {self.grae_clamp}")
        if not (0 <= self.clip_eps_low < 1 and self.clip_eps_high >= 0):
            raise ValueError("AlgorithmConfig.clip_eps_low must be in [0, 1) and clip_eps_high >= 0")

    def replace(self, **changes: object) -> "AlgorithmConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


REGISTRIES: tuple[Registry, ...] = (ADV_ESTIMATORS, POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS,
                                    TURN_ORDERS, M_FACTORS)
REGISTRY_FIELDS: frozenset[str] = frozenset(r.field for r in REGISTRIES)


def registered_functions(cfg: "AlgorithmConfig") -> tuple[object, ...]:
    """The functions registered now under ``cfg``'s names, one per registry: with ``cfg``, the key of a result
    memoised per algorithm (a function registered again under its name is a new algorithm)."""
    return tuple(registry.get(getattr(cfg, registry.field)).fn for registry in REGISTRIES)


def choices() -> dict[str, tuple[str, ...]]:
    """Every choice field of :class:`AlgorithmConfig` and its allowed values, now.

    The registry fields list what is registered at the time of the call (built-ins first, then
    user entries); the others read their ``Literal`` annotation.
    """
    literal = _literal_choices()
    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(AlgorithmConfig):
        if "choices" in f.metadata:
            out[f.name] = f.metadata["choices"]()
        elif f.name in literal:
            out[f.name] = literal[f.name]
    return out


@functools.lru_cache(maxsize=1)
def _literal_choices() -> dict[str, tuple[str, ...]]:
    hints = typing.get_type_hints(AlgorithmConfig)
    return {k: get_args(h) for k, h in hints.items() if typing.get_origin(h) is Literal}


PRESETS: dict[str, AlgorithmConfig] = {
    # GAE + token-level PPU (Schulman et al. 2017; Ouyang et al. 2022).
    "ppo": AlgorithmConfig(name="ppo", preset="ppo", advantage="gae", gae_token_level=True, update="ppo", ratio_level="token"),
    # GRAE (group std) + token-level PPU (Shao et al. 2024).
    "grpo": AlgorithmConfig(name="grpo", preset="grpo", advantage="grae", grae_scale="group_std", update="ppo", ratio_level="token"),
    # REINFORCE++ (Hu 2025; OpenRLHF's advantage_estimator="reinforce"): each token's return-to-go, no
    # baseline, whitened over the batch, token-level PPU.
    "reinforce_pp": AlgorithmConfig(
        name="reinforce_pp", preset="reinforce_pp", advantage="reinforce_pp", update="ppo", ratio_level="token"
    ),
    # REINFORCE++-baseline (Hu 2025; OpenRLHF's "reinforce_baseline"): the group's mean reward subtracted,
    # then the batch z-score (GRAE + batch_std), token-level PPU. The SeeUPO paper's Table 1 reads
    # REINFORCE++ as this one (GRAE), and its REINFORCE++ row runs it.
    "reinforce_pp_baseline": AlgorithmConfig(
        name="reinforce_pp_baseline", preset="reinforce_pp_baseline", advantage="grae", grae_scale="batch_std",
        update="ppo", ratio_level="token"
    ),
    # GRAE (group std) + sequence-level PPU, the sequence being the whole trajectory as in
    # mainstream multi-turn trainers (Zheng et al. 2025), with the paper's clip range
    # (GSPO §5.1: "3e-4 and 4e-4"; verl's examples/gspo_trainer, TRL's paper index); its
    # per-sequence token mean is over the trajectory's row too, as verl's agent loop lays it out.
    "gspo": AlgorithmConfig(
        name="gspo", preset="gspo", advantage="grae", grae_scale="group_std", update="ppo", ratio_level="sequence",
        ratio_scope="trajectory", length_norm=True, aggregation="seq_mean_token_mean", aggregation_rows="trajectory",
        clip_eps_low=3e-4, clip_eps_high=4e-4,
    ),
    # Leave-one-out GRAE + REINFORCE (Kool et al. 2019; Ahmadian et al. 2024).
    "rloo": AlgorithmConfig(name="rloo", preset="rloo", advantage="grae", grae_center="loo", update="reinforce"),
    # GRAE + batch z-score + per-turn sequence-level PPU, turns updated in reverse order with
    # the HAPPO weight M keyed by trajectory (docs/method.md §4).
    "seeupo": AlgorithmConfig(
        name="seeupo", preset="seeupo", advantage="grae", grae_scale="batch_std", update="ppo", ratio_level="sequence",
        ratio_scope="turn", length_norm=True, aggregation="seq_mean_token_mean", schedule="sequential",
        order="reverse", m_factor="happo",
    ),
}

#: The clip range of every row of the SeeUPO paper's Table 1 ("0.2 in the paper"): its taxonomy compares the classes
#: at one clip, so ``seeupo verify``'s GSPO row and the searches about it keep this range, where the ``gspo`` preset
#: has the GSPO paper's own (3e-4, 4e-4).
TABLE1_CLIP: dict[str, float] = {"clip_eps_low": 0.2, "clip_eps_high": 0.2}

#: The presets defined here (the paper's algorithms); :func:`register_preset` adds others to PRESETS.
BUILTIN_PRESETS: frozenset[str] = frozenset(PRESETS)


# Fields that make an algorithm what it is. Changing one of them makes a different algorithm,
# so :func:`preset` renames it; the other fields (group size, clip range, KL coefficient, epochs,
# ...) are hyperparameters of the same algorithm and keep its name.
IDENTITY_FIELDS: tuple[str, ...] = (
    "advantage", "gae_token_level", "grae_center", "grae_scale", "update", "ratio_level", "ratio_scope", "length_norm",
    "aggregation", "aggregation_rows", "schedule", "order", "custom_order", "m_factor", "m_length_norm", "m_refresh", "m_alignment",
    "equal_budget",
)


# Identity fields that only a sequential schedule reads: under the simultaneous one they change nothing.
SEQUENTIAL_ONLY_FIELDS: tuple[str, ...] = (
    "order", "custom_order", "m_factor", "m_length_norm", "m_refresh", "m_alignment", "equal_budget",
)


def modified_name(base: str, changes: dict[str, object]) -> str:
    """The name of preset ``base`` with ``changes``: ``base`` itself when no identity field changed,
    else ``base+field=value,...`` (identity fields only, in declaration order), so that a modified
    preset is never reported under the name of the algorithm it is not. A field of
    :data:`SEQUENTIAL_ONLY_FIELDS` counts only when the schedule is sequential."""
    reference = PRESETS[base]
    sequential = changes.get("schedule", reference.schedule) == "sequential"
    changed = [k for k in IDENTITY_FIELDS if k in changes and changes[k] != getattr(reference, k)
               and (sequential or k not in SEQUENTIAL_ONLY_FIELDS)]
    if not changed:
        return base
    return base + "+" + ",".join(f"{k}={_show(changes[k])}" for k in changed)


def _show(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return "-".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def preset(preset_name: str, /, **overrides: object) -> AlgorithmConfig:
    """A named preset, with any field overridden: ``preset("seeupo", order="forward")``.

    The result's ``name`` says what it is: the preset's own name when only hyperparameters
    changed, ``"seeupo+order=forward"`` when an identity field (:data:`IDENTITY_FIELDS`) changed,
    or the ``name`` passed explicitly: ``preset("grpo", name="drgrpo", aggregation=...,
    grae_scale="none")``. ``preset`` records ``preset_name`` either way.
    """
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; choose from {sorted(PRESETS)}")
    changes = dict(overrides)
    name = changes.pop("name", None)
    changes.pop("preset", None)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"AlgorithmConfig.name must be a non-empty string, got {name!r}")
    cfg = PRESETS[preset_name].replace(**changes, name=name or modified_name(preset_name, changes), preset=preset_name)
    if name in PRESETS and modified_name(name, {k: getattr(cfg, k) for k in IDENTITY_FIELDS}) != name:
        differ = [k for k in IDENTITY_FIELDS if getattr(cfg, k) != getattr(PRESETS[name], k)]
        # a clash of names (a plugin loader reports it in one line), not a bug in the caller's code
        raise NameClash(f"name {name!r} is the name of a preset whose {', '.join(differ)} differ from this algorithm's; "
                        "choose another name")
    return cfg


def register_preset(config: AlgorithmConfig) -> AlgorithmConfig:
    """Add ``config`` to :data:`PRESETS` under ``config.name``, so that every command can name it.

    What a plugin calls to name its algorithm: ``register_preset(preset("grpo", name="dr_grpo",
    grae_scale="none", aggregation="dr_grpo_constant"))``; then ``seeupo check dr_grpo``,
    ``seeupo verify --algorithms dr_grpo`` and ``algorithm.preset: dr_grpo`` in a run config work.
    The saved ``preset`` field becomes the name, so a run records the algorithm it ran. A name
    already registered is an error (:class:`~seeupo.core.registry.NameClash`), never an override.
    Returns the registered configuration.
    """
    name = config.name
    if not isinstance(name, str) or not name.strip() or name == "custom":
        raise ValueError(f"a preset needs a name of its own (AlgorithmConfig.name), got {name!r}")
    if name in PRESETS:
        raise NameClash(f"preset {name!r} is already registered; choose another name")
    PRESETS[name] = config.replace(preset=name)
    return PRESETS[name]
