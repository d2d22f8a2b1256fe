"""Turn-PPO as a plugin: PPO on the turn-level MDP, with turn-level GAE and a per-turn sequence ratio.

Li, Zhou, Meng, Vadera, Li, Li (2025), "Turn-PPO: Turn-Level Advantage Estimation with PPO for
Improved Multi-Turn RL in Agentic LLMs", arXiv:2512.17008 (Findings of EACL 2026). AReaL's
``gae_timestep_unit: turn`` is the same estimator.

Turn-PPO treats a whole turn (the model's response to one observation) as one action of an MDP
whose states are the histories ``h_t``. Its critic values ``V(h_t)`` once per turn, and GAE runs
over turns::

    delta_t = r_t + gamma V(h_{t+1}) - V(h_t),    A_t = sum_k (gamma lambda)^k delta_{t+k}

with every token of turn ``t`` given ``A_t``. The policy ratio is the turn's: the geometric mean of
its token ratios, ``exp(mean_j log pi(y_j) / pi_old(y_j))``, clipped as one unit, so that no turn
moves by more than the clip range as a whole. The paper's recommended ``gamma = 0.99`` and
``lambda = 0.9`` are the preset's.

This needs no new piece: the built-in ``gae`` estimator with ``gae_token_level=False`` is
turn-level GAE (:func:`seeupo.core.advantages.gae_for_batch`), and ``ratio_level="sequence"``,
``ratio_scope="turn"``, ``length_norm=True`` is the per-turn geometric-mean ratio. The file
registers the preset ``turn_ppo``.

Simplified, and why:

* the critic: in the tabular engine it is exact (``V`` of the current policy at every history, the
  check's reference; :func:`seeupo.tabular.rollout.critic_values`), where the paper trains one;
  on a language model it is the trainer's learned critic, as for ``ppo``;
* ``gamma = 0.99`` discounts the advantage while the problems' own return may be undiscounted:
  the paper's choice, kept, so the check measures what it does to the undiscounted ``J``.
"""

from seeupo.core.config import preset, register_preset

register_preset(preset(
    "ppo", name="turn_ppo", gae_token_level=False, gae_gamma=0.99, gae_lambda=0.9,
    ratio_level="sequence", ratio_scope="turn", length_norm=True,
))
