"""What an explanation holds: the thresholds that name a cause, and the typed explanation (:func:`~seeupo.experiments.explain.explain`'s result)."""

from __future__ import annotations

from dataclasses import dataclass, field

from seeupo.tabular.gradient import REL_TOL


CAUSES = ("flat surrogate", "M factor", "std scaling", "own-action baseline", "advantage sign", "optimizer",
          "step size", "no decrease")
FLAT = 1e-12  # a change of J smaller than this is round-off, not a decrease
VANISHING = 100.0
"""The expected gradient counts as vanishing when the optimizer's first step is at least this many times
longer than plain gradient ascent's (same lr): then the step's length is the optimizer's, not the gradient's."""
FLAT_SIGNAL = 1e-5
"""The expected advantages are *flat* (zero) when none exceeds this fraction of the largest advantage the batch
holds. Float64 round-off in these weighted means is about 1e-13 of that scale; what lies between is no signal of
the rewards but a stabilising constant, such as the 1e-6 added to a group's standard deviation (with it set to 0
the expected advantages of DAPO on the hand-made flat bandit vanish to 5.6e-17, tests/experiments/test_explain.py)."""
SLOPE_TOL = REL_TOL
"""``grad J . g`` counts as negative (zero) when below (within) this fraction of ``|grad J| |g|``
(:data:`seeupo.tabular.gradient.REL_TOL`: float64 sums of a few thousand terms)."""
SCALE_INVARIANT = 1e-3
"""An estimator is scale-normalised when doubling every reward changes no expected advantage by more than this
fraction (a std-scaled one moves by about its constant over the std, 1e-6; an unscaled one doubles)."""


@dataclass
class Outcome:
    """One observation after ``(h, a)``: its probability, the reward, and whether the episode ends."""

    observation: int
    probability: float
    reward: float
    ends: bool


@dataclass
class AdvantageClass:
    """Trajectories through ``(h, a)`` with the same return that received the same advantage.

    ``weight`` is the probability of such a trajectory together with its group-mates' configuration
    (summed over the class): the weight the update gives the class's advantage.
    """

    trajectory_return: float
    advantage: float
    weight: float


@dataclass
class ActionRow:
    """One action at one reachable history, before and after the update."""

    turn: int
    history: int
    history_label: str  # e.g. "s0=0, a0=1, o0=0"
    reach: float  # probability of reaching the history under the policy before the update
    action: int
    prob_before: float
    prob_after: float
    q: float  # exact Q_t(h, a) under the policy before the update
    true_advantage: float  # Q_t(h, a) - V_t(h)
    expected_advantage: float  # E[A_hat | h, a], weighted mean over the batch's rows at (h, a)
    outcomes: list[Outcome]
    classes: list[AdvantageClass]

    @property
    def wrong_sign(self) -> bool:
        """The expected advantage has the opposite sign of the true one (both nonzero)."""
        return self.true_advantage * self.expected_advantage < 0


@dataclass
class OptimizerRun:
    """The explained iteration's update with one optimizer: ``J`` before and after each step.

    ``gradient_norm`` and ``slope`` are those of the first step: the norm of the expected gradient
    of the surrogate at the start, and ``grad J . g``, the first-order change of ``J`` per unit
    step along the ascent direction ``g`` (negative: the expected update points downhill);
    ``first_step_length`` is the length of the parameters' first move (plain gradient ascent:
    ``lr |g|``; Adam: about ``lr`` per parameter).
    """

    optimizer: str
    lr: float
    J: list[float]  # J[0] before, J[k] after step k
    best_action_prob: list[float]  # P(Explanation.watched action) before and after each step
    gradient_norm: float
    slope: float
    first_step_length: float
    # (turn, grad J . g on that turn's parameters) at the first step that moved each turn, in the order the
    # turns were updated; independent parameters only (shared parameters do not split by turn)
    turn_slopes: list[tuple[int, float, float]] = field(default_factory=list)  # (turn, slope, |g| |grad J| there)
    slope_scale: float = 0.0  # |g| |grad J| at the first step: the size against which the slope's sign is read

    @property
    def steps(self) -> int:
        return len(self.J) - 1


@dataclass
class Explanation:
    """Everything :func:`render` prints about one counterexample (see the module docstring)."""

    description: str
    settings: str  # the algorithm and run settings in one line
    mode: str
    iteration: int  # 1-based, the iteration explained
    iterations: int
    J_before: float
    J_after: float
    J_star: float
    recorded_after: float
    actions: list[ActionRow]
    update: OptimizerRun | None  # None for the closed-form mirror step
    # plain gradient ascent from the same start; None if the update was plain already or a mirror step
    plain: OptimizerRun | None
    cause: str
    reasons: list[str] = field(default_factory=list)  # the numbers behind the cause, one sentence each
    watched: tuple[int, int, int] = (0, 0, 0)  # (turn, history, action) whose probability OptimizerRun traces
    watched_label: str = "s0=0"
    what_changes: str = ""  # the computed change that keeps J from falling (one sentence), or ""

    @property
    def reproduces(self) -> bool:
        return abs(self.J_after - self.recorded_after) <= 1e-8
