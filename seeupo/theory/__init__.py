"""Symbolic theory layer: derivations in sympy, each with a numeric cross-check against the tabular engine.

* :mod:`~seeupo.theory.grae_moments`: conditional moments of GRAE; when its conditional mean is
  affine in ``Q`` (binary returns: always; group std with non-binary returns: not).
* :mod:`~seeupo.theory.surrogate_bound`: the PPO-clip surrogate lower-bounds the linear objective
  (proof by cases) and the resulting state-wise / monotonic improvement for affine signals.
* :mod:`~seeupo.theory.haml`: multi-agent advantage decomposition and the importance-ratio
  identity behind the sequential (HAML) update.
* :mod:`~seeupo.theory.backward_induction`: exact argmax sweeps; reverse order is backward induction.
* :mod:`~seeupo.theory.discounting`: REINFORCE-GRAE at ``gamma < 1`` is exact gradient ascent on ``J_gamma``.
"""

from seeupo.theory.backward_induction import (
    FORWARD_TWO_SWEEPS_REWARDS,
    ReverseSweepProof,
    SweepResult,
    argmax_sweep,
    engine_sweep_values,
    forward_needs_two_sweeps,
    optimal_value,
    reward_table,
    sweeps,
    symbolic_reverse_sweep,
    uniform_policy,
)
from seeupo.theory.discounting import (
    DISCOUNT_ALGORITHMS,
    GradientCheck,
    GradientIdentity,
    LimitResult,
    SearchResult,
    engine_gradient_check,
    group_std_contrast,
    measure_limit,
    search_discounted_counterexample,
    symbolic_gradient_identity,
)
from seeupo.theory.grae_moments import (
    AffineCheck,
    BinaryCertificate,
    Moments,
    affine_check,
    binary_affine_certificate,
    conditional_mean_given_return,
    conditional_moments_given_return,
    engine_first_turn_signal_means,
    engine_moments_given_return,
    engine_q_first_turn,
    first_turn_return_distributions,
    grae_conditional_moments,
    grae_moments_by_expansion,
    grae_signal,
    is_state_affine,
    non_affine_instance,
    state_affine_check,
)
from seeupo.theory.haml import (
    IdentityProof,
    coalition_q,
    haml_weighted_expectation,
    joint_advantage,
    mixed_expectation,
    multi_agent_advantages,
    symbolic_advantage_decomposition,
    symbolic_importance_identity,
)
from seeupo.theory.surrogate_bound import (
    ImprovementDerivation,
    SurrogateCase,
    derive_statewise_improvement,
    exact_clip_step,
    group_std_decrease_instance,
    maximise_clipped_surrogate,
    performance_difference,
    prove_clip_lower_bound,
    statewise_gains,
    surrogate_and_linear,
    tight_at_one,
)

__all__ = [
    "DISCOUNT_ALGORITHMS", "FORWARD_TWO_SWEEPS_REWARDS", "AffineCheck", "BinaryCertificate", "GradientCheck", "GradientIdentity",
    "IdentityProof", "ImprovementDerivation", "LimitResult", "Moments", "ReverseSweepProof", "SearchResult",
    "SurrogateCase", "SweepResult", "affine_check", "argmax_sweep", "binary_affine_certificate", "coalition_q",
    "conditional_mean_given_return", "conditional_moments_given_return", "derive_statewise_improvement",
    "engine_first_turn_signal_means", "engine_gradient_check", "engine_moments_given_return", "engine_q_first_turn", "engine_sweep_values",
    "exact_clip_step", "first_turn_return_distributions", "forward_needs_two_sweeps", "grae_conditional_moments",
    "grae_moments_by_expansion", "grae_signal", "group_std_contrast", "group_std_decrease_instance",
    "haml_weighted_expectation", "is_state_affine", "joint_advantage", "maximise_clipped_surrogate",
    "measure_limit", "mixed_expectation", "multi_agent_advantages", "non_affine_instance", "optimal_value",
    "performance_difference", "prove_clip_lower_bound", "reward_table", "search_discounted_counterexample",
    "state_affine_check", "statewise_gains", "surrogate_and_linear", "sweeps", "symbolic_advantage_decomposition",
    "symbolic_gradient_identity", "symbolic_importance_identity", "symbolic_reverse_sweep", "tight_at_one",
    "uniform_policy",
]
