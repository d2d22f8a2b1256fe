"""Where each catalogue algorithm's definition comes from: one row per choice, its source, and where the toolkit departs.

A card measures the toolkit's version of an algorithm; this says how close that version is to the
one its authors run. Each :class:`Setting` gives what the source publishes (the paper's section, or
the authors' repository, file and function, at the commit read), what the toolkit's preset or
plugin does, and, where the two differ, why. Where the authors publish more than one setting the
toolkit takes their default and registers the others as presets (``gigpo_std``;
``reinforce_pp_baseline``). The sources were read in the repositories at these commits: verl
``b178a3cd`` (its DAPO recipe at ``4f80e46``), verl-agent (the fork ``vanzll/verl-agent`` at
``d0b9724``, the authors' commit #183), TRL ``f2cd5771``, OpenRLHF ``3c3be623``, understand-r1-zero
``dfca49dd`` with oat 0.1.3, Multi-Turn-RL-Agent ``7dbdd08``.

What no algorithm's table can match: the exact mode's optimizer protocol. A training run takes a
few optimizer steps of lr ~1e-6 on a sampled batch; the exact capabilities take the expected batch
and ``seeupo verify``'s protocol (40 Adam epochs at lr 0.05 for a clipped surrogate; 10 SGD steps at
lr 5 for a plain policy gradient). :data:`PROTOCOL` says so on every card, and
:func:`seeupo.experiments.scorecard.card.protocol_sweep` measures how the scores move across a sweep of it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The rows of every definition table, in order (a list of allowed aspects lives here).
ASPECTS = ("advantage", "ratio", "clip", "aggregation and rows", "KL", "discount", "grouping",
           "epochs and minibatches", "other")

PROTOCOL = ("exact mode: the expected batch, 40 Adam epochs at lr 0.05 per update for a clipped surrogate (10 SGD "
            "steps at lr 5 for a plain policy gradient), the published KL term toward the run's start policy; the "
            "authors' learning rate (~1e-6), batch and minibatch sizes have no tabular counterpart")


@dataclass(frozen=True)
class Setting:
    """One choice of an algorithm: what its ``source`` publishes, what the toolkit does, and why it departs (``None``:
    it does not)."""

    aspect: str
    published: str
    source: str
    toolkit: str
    departs: str | None = None

    def __post_init__(self) -> None:
        if self.aspect not in ASPECTS:
            raise ValueError(f"unknown aspect {self.aspect!r}; expected one of {ASPECTS}")


#: Where the card's KL term comes from: the catalogue's published settings on top of the KL-free preset.
_CARD_KL = ("; the card's reference is the run's start policy, frozen (an update measured alone: its own start); "
            "the preset itself (seeupo verify, seeupo check) has none")
_EPOCHS = ("the exact protocol", "no tabular counterpart: see the protocol sweep on the card")

S = Setting
VERL, VERL_AGENT, TRL, OPENRLHF = "verl@b178a3cd", "verl-agent@d0b9724", "TRL@f2cd5771", "OpenRLHF@3c3be623"

DEFINITIONS: dict[str, tuple[Setting, ...]] = {
    "ppo": (
        S("advantage", "GAE over tokens, gamma 1, lambda 1, whitened over the batch", f"{VERL} ppo_trainer.yaml "
          "(algorithm.gamma, lam); core_algos.compute_gae_advantage_return (masked_whiten)",
          "GAE over tokens, gamma 1, lambda 1, with the exact critic V^pi; not whitened",
          "an exact critic (the check's reference), where the authors train one; whitening is a positive scale and "
          "shift per batch, left out"),
        S("ratio", "token", "Schulman et al. 2017, Eq. 7", "token"),
        S("clip", "0.2 (verl: dual clip 3.0 on negative advantages)", f"{VERL} actor.yaml clip_ratio, clip_ratio_c",
          "0.2, no dual clip", "the dual clip acts only far from ratio 1, which 40 epochs from one batch rarely reach"),
        S("aggregation and rows", "token-mean over the batch; one row per response", f"{VERL} actor.yaml loss_agg_mode",
          "token_mean; one row per turn"),
        S("KL", "k1 in the reward, 0.001 (off by default)", f"{VERL} ppo_trainer.yaml use_kl_in_reward, kl_ctrl",
          "none (verl's default)"),
        S("discount", "1", f"{VERL} algorithm.gamma", "1"),
        S("grouping", "none (one response per prompt)", "Schulman et al. 2017", "none"),
        S("epochs and minibatches", "1 epoch, mini-batches of 256 prompts", f"{VERL} actor.yaml ppo_epochs, "
          "ppo_mini_batch_size", *_EPOCHS),
    ),
    "grpo": (
        S("advantage", "(R - group mean) / group std", "Shao et al. 2024, §4.1.2; verl core_algos."
          "compute_grpo_outcome_advantage (unbiased std + 1e-6)", "grae, group_std (unbiased std + 1e-6)"),
        S("ratio", "token", "Shao et al. 2024, Eq. 3", "token"),
        S("clip", "not stated in the paper; verl and TRL default 0.2", f"{VERL} actor.yaml clip_ratio; {TRL} "
          "GRPOConfig.epsilon", "0.2"),
        S("aggregation and rows", "per-response token mean, then the group mean (seq-mean-token-mean); verl's "
          "default and examples token-mean", "Shao et al. 2024, Eq. 3; verl docs/algo/grpo.md",
          "token_mean (verl's default); one row per turn",
          "verl's examples run token-mean; the paper's 1/|o_i| is preset(\"grpo\", aggregation=\"seq_mean_token_mean\"), "
          "which differs where answers differ in length (length_weighting)"),
        S("KL", "k3 in the loss, beta 0.04", "Shao et al. 2024, §4.2 (\"The KL coefficient is 0.04\"), Eq. 4",
          "k3 in the loss, 0.04" + _CARD_KL),
        S("discount", "none (outcome reward)", "Shao et al. 2024", "1"),
        S("grouping", "G outputs per question (64)", "Shao et al. 2024, §4.2", "G = 4 (the scorecard's sizes)"),
        S("epochs and minibatches", "one update per exploration stage", "Shao et al. 2024, §4.2", *_EPOCHS),
    ),
    "dr_grpo": (
        S("advantage", "R - group mean (no std)", "understand-r1-zero train_zero_math.py compute_monte_carlo_advantages "
          "(\"Dr. GRPO Modification 2\")", "grae, no scale"),
        S("ratio", "token", "oat ppo.py (ratio = exp(new - old))", "token"),
        S("clip", "0.2", "oat PPOArgs.cliprange", "0.2"),
        S("aggregation and rows", "each response's token sum over a constant, generate_max_length (3000), then the "
          "mean over responses", "understand-r1-zero train_zero_math.py (masked_sum(..., constant_normalizer="
          "generate_max_length), \"Dr. GRPO Modification 1\")", "dr_grpo_token_sum: token sum over MAX_TOKENS = 512 "
          "per row, mean over rows; one row per turn", "the constant is one turn's budget of the toolkit's trainer; "
          "a constant sets only the step size"),
        S("KL", "none (--beta 0)", "understand-r1-zero examples/qwen2.5-math-7b.sh", "none"),
        S("discount", "1", "oat PPOArgs.gamma", "1"),
        S("grouping", "8 responses per prompt", "understand-r1-zero examples (N_SAMPLE=8)", "G = 4"),
        S("epochs and minibatches", "1 epoch, 8 optimizer steps per rollout batch (inferred from the batch sizes)",
          "understand-r1-zero examples (num_ppo_epochs 1, train_batch_size 128)", *_EPOCHS),
    ),
    "dapo": (
        S("advantage", "(R - group mean) / group std, groups with all-equal rewards filtered out and resampled",
          "Yu et al. 2025, §3.2, §4.1; verl-recipe dapo_ray_trainer.py (kept_prompt_uids: std > 0)",
          "the dapo estimator: GRPO's advantage of the informative groups, rescaled by N / N_inf (exactly the "
          "filtered batch's token mean)"),
        S("ratio", "token", "Yu et al. 2025, Eq. 8", "token"),
        S("clip", "0.2 / 0.28 (clip-higher); the verl recipe adds a dual clip of 10", "Yu et al. 2025, §4.1; verl "
          "recipe/dapo/run_dapo_qwen2.5_32b.sh@4f80e46", "0.2 / 0.28, no dual clip",
          "a dual clip of 10 acts only at ratios far from 1"),
        S("aggregation and rows", "token-mean over every token of the batch; one row per response", "Yu et al. 2025, "
          "Eq. 8; verl recipe loss_agg_mode=token-mean", "token_mean; one row per turn"),
        S("KL", "none (removed)", "Yu et al. 2025, §2.3", "none"),
        S("discount", "none", "Yu et al. 2025", "1"),
        S("grouping", "16 responses per prompt", "Yu et al. 2025, §4.1", "G = 4"),
        S("epochs and minibatches", "16 gradient updates per rollout step", "Yu et al. 2025, §4.1", *_EPOCHS),
        S("other", "overlong reward shaping (soft punishment past 16,384 tokens)", "Yu et al. 2025, §3.4",
          "none", "the toolkit's answers are at most a few tokens long: there is no budget to overrun"),
    ),
    "gspo": (
        S("advantage", "(R - group mean) / group std", "Zheng et al. 2025, Eq. 6; verl GSPO scripts "
          "(adv_estimator=grpo)", "grae, group_std (unbiased std + 1e-6)"),
        S("ratio", "sequence: the geometric mean of the response's token ratios", "Zheng et al. 2025, Eq. 7; verl "
          "core_algos.compute_policy_loss_gspo", "sequence, length-normalised, over the whole trajectory "
          "(ratio_scope=trajectory)", "a multi-turn trainer's row is the trajectory (verl's agent loop): its turns "
          "share one ratio"),
        S("clip", "3e-4 / 4e-4", "Zheng et al. 2025, §5.1 (\"3e-4 and 4e-4\"); verl examples/gspo_trainer/"
          "test_gspo_3b_math.sh; TRL paper_index.md", "3e-4 / 4e-4 (0.2 in Table 1's row, TABLE1_CLIP)"),
        S("aggregation and rows", "per-sequence mean (seq-mean-token-mean, hard-coded in verl's gspo loss); one row "
          "per response", "Zheng et al. 2025, Eq. 5; verl compute_policy_loss_gspo",
          "seq_mean_token_mean over one row per trajectory (aggregation_rows=trajectory), the ratio over the "
          "trajectory", "a multi-turn trainer's row is the trajectory (verl's agent loop): a trajectory's turns "
          "share one token mean, so a longer episode weighs each of its tokens less"),
        S("KL", "omitted (\"for brevity\"); verl and TRL run beta 0", "Zheng et al. 2025, §2; TRL paper_index.md "
          "(beta=0.0)", "none"),
        S("discount", "1", f"{VERL} algorithm.gamma", "1"),
        S("grouping", "G responses per query", "Zheng et al. 2025, Eq. 5", "G = 4"),
        S("epochs and minibatches", "each rollout batch in 4 minibatches", "Zheng et al. 2025, §5.1; verl "
          "test_gspo_3b_math.sh (ppo_mini_batch_size=128 of 512)", *_EPOCHS),
    ),
    "rloo": (
        S("advantage", "R - the mean of the other G - 1 rewards", "Ahmadian et al. 2024, §3; Kool et al. 2019; "
          f"{TRL} RLOOTrainer (rloo_k=2)", "grae, leave-one-out, no scale"),
        S("ratio", "none: REINFORCE on the whole completion (TRL clips a sequence ratio at 0.2)", "Ahmadian et al. "
          f"2024, §3; {TRL} RLOOConfig (cliprange 0.2, num_ppo_epochs 4 before v0.22)", "none: REINFORCE"),
        S("clip", "none", "Ahmadian et al. 2024", "none"),
        S("aggregation and rows", "the completion's log-probability (a token sum); one row per completion",
          "Ahmadian et al. 2024, §3", "token_mean; one row per turn",
          "on the expected batch the token mean is the token sum over a constant (the expected token count): the "
          "same direction, whatever the answers' lengths"),
        S("KL", "sequence-level KL in the reward, 0.05", f"{TRL} RLOOConfig kl_coef / beta",
          "k1 summed over the answer's tokens, in the reward, 0.05" + _CARD_KL),
        S("discount", "none", "Ahmadian et al. 2024", "1"),
        S("grouping", "k completions per prompt (2)", f"{TRL} RLOOConfig rloo_k", "G = 4"),
        S("epochs and minibatches", "one update per batch", "Ahmadian et al. 2024", *_EPOCHS),
    ),
    "reinforce_pp": (
        S("advantage", "each token's return-to-go with the KL penalty in its reward, no baseline, whitened over "
          "every valid token of the batch (var.clamp(min=1e-8).rsqrt())", f"{OPENRLHF} experience_maker (advantage_"
          "estimator=reinforce: get_cumulative_returns, the whitening); Hu 2025", "reinforce_pp: the return-to-go, "
          "whitened over the batch's tokens (eps 1e-8); verl's reinforce_plus_plus, with its Bessel-corrected "
          "variance, differs by sqrt(N / (N - 1)) (tests/integrations/test_verl.py)"),
        S("ratio", "token", f"{OPENRLHF} PolicyLoss", "token"),
        S("clip", "0.2", f"{OPENRLHF} --eps_clip", "0.2"),
        S("aggregation and rows", "token mean; one row per response", f"{OPENRLHF} PolicyLoss (masked_mean)",
          "token_mean; one row per turn"),
        S("KL", "k1 in each token's reward, init_kl_coef 0.01, clamped to [-10, 10]", f"{OPENRLHF} "
          "models/utils.compute_reward", "k1 in the reward, 0.01, each turn's tokens summed into its reward; no clamp"
          + _CARD_KL, "a row is a turn: a token's penalty joins its turn's reward, so the return-to-go of a token "
          "counts the penalties of the tokens before it in its turn; the clamp never binds on these problems"),
        S("discount", "gamma 1 (honoured for this variant)", f"{OPENRLHF} --gamma", "gae_gamma = 1"),
        S("grouping", "none needed (one sample per prompt allowed)", "Hu 2025", "G = 4 (the draws' group)"),
        S("epochs and minibatches", "1 epoch", f"{OPENRLHF} --max_epochs", *_EPOCHS),
    ),
    "reinforce_pp_baseline": (
        S("advantage", "R - the group's mean reward (no std), then whitened over the batch", f"{OPENRLHF} "
          "experience_maker (reinforce_baseline: rewards - rewards.mean(-1)); commit e37ff6ea (\"with / std and K3 kl "
          "loss removed\")", "grae, mean-centred, batch_std (the exact mode weighs trajectories, not tokens)",
          "the batch z-score counts each trajectory once where OpenRLHF counts tokens: equal with one turn of "
          "fixed-length answers"),
        S("ratio", "token", f"{OPENRLHF} PolicyLoss", "token"),
        S("clip", "0.2", f"{OPENRLHF} --eps_clip", "0.2"),
        S("aggregation and rows", "token mean; one row per response", f"{OPENRLHF} PolicyLoss", "token_mean; one row "
          "per turn"),
        S("KL", "the authors' scripts: k2 as a loss, 1e-5 (train_reinforce_baseline_hybrid_engine.sh)", OPENRLHF,
          "k2 in the loss, 1e-5" + _CARD_KL),
        S("discount", "1 (forced)", f"{OPENRLHF} experience_maker", "1"),
        S("grouping", "n samples per prompt (> 1 required)", OPENRLHF, "G = 4"),
        S("epochs and minibatches", "1 epoch", OPENRLHF, *_EPOCHS),
    ),
    "mt_grpo": (
        S("advantage", "before the first tool result: z(R^O) + z(R^T); after it: z(R^O); no tool result: z(R^T + "
          "R^O); z over the group, std + 1e-4", "Multi-Turn-RL-Agent mt_grpo_env_trainer.py _assign_advantages "
          "(turn_advantage_coef 1)", "the same rule; R^T the reward after turn 0 of an episode that continued, R^O "
          "the rest of its return", "the turn reward is the problem's reward after turn 0 where the paper's is a "
          "verifier of the tool call"),
        S("ratio", "token", "TRL GRPOTrainer at the pinned commit fc4dae2", "token"),
        S("clip", "0.2", "TRL GRPOConfig.epsilon at fc4dae2", "0.2"),
        S("aggregation and rows", "token mean over the micro-batch", "TRL GRPOTrainer at fc4dae2", "token_mean; one row "
          "per turn"),
        S("KL", "beta 0 in the authors' script", "Multi-Turn-RL-Agent scripts", "none"),
        S("discount", "none", "Zeng et al. 2025", "1"),
        S("grouping", "21 generations per prompt", "Multi-Turn-RL-Agent scripts (num_generations)", "G = 4"),
        S("epochs and minibatches", "num_iterations 2", "Multi-Turn-RL-Agent scripts", *_EPOCHS),
    ),
    "gigpo": (
        S("advantage", "episode: R - group mean; step: the discounted return-to-go less its anchor-state group's "
          "mean (a group of one: 0); A = episode + 1.0 x step; mode mean_norm (no std; mean_std_norm divides each "
          "by its std + 1e-6)", f"{VERL_AGENT} gigpo/core_gigpo.py compute_gigpo_outcome_advantage (mode="
          "\"mean_norm\"), ppo_trainer.yaml algorithm.gigpo", "gigpo: the same, no std (gigpo_std: mean_std_norm)"),
        S("ratio", "token", f"{VERL_AGENT} (verl's vanilla loss)", "token"),
        S("clip", "0.2", f"{VERL_AGENT} ppo_trainer.yaml", "0.2"),
        S("aggregation and rows", "token-mean; one row per (trajectory, step)", f"{VERL_AGENT} ppo_trainer.yaml "
          "loss_agg_mode", "token_mean; one row per turn"),
        S("KL", "low_var_kl (k3) in the loss, 0.01", f"{VERL_AGENT} examples/gigpo_trainer/run_*.sh",
          "k3 in the loss, 0.01" + _CARD_KL),
        S("discount", "gamma 0.95 for the step return", f"{VERL_AGENT} examples/gigpo_trainer/run_*.sh "
          "(algorithm.gamma=0.95)", "GAMMA = 0.95"),
        S("grouping", "episode: the group's rollouts (uid); step: identical anchor observations across all turns of "
          "the group, mean and std over step rows", f"{VERL_AGENT} build_step_group (to_hashable(anchor_obs)), "
          "episode_norm_reward (compute_mean_std_cross_steps=True)", "step: identical (turn, history); episode "
          "statistics over trajectories", "a tree MDP's observation is not the agent's state (its history is); "
          "statistics over trajectories are the paper's Eq. 3"),
        S("epochs and minibatches", "1 epoch, several mini-batches of step rows", f"{VERL_AGENT} scripts", *_EPOCHS),
    ),
    "turn_ppo": (
        S("advantage", "turn-level GAE with a learned turn-level critic, gamma 0.99, lambda 0.9", "Li et al. 2025, §3 "
          "(no public code found)", "gae over turns, gamma 0.99, lambda 0.9, the exact critic",
          "an exact critic, where the paper trains one"),
        S("ratio", "per turn (the turn is one action)", "Li et al. 2025, §3", "sequence, per turn, length-normalised"),
        S("clip", "not confirmed", "Li et al. 2025", "0.2"),
        S("aggregation and rows", "not confirmed", "Li et al. 2025", "token_mean; one row per turn"),
        S("KL", "not confirmed", "Li et al. 2025", "none", "the paper's KL setting was not confirmed: none is run"),
        S("discount", "0.99", "Li et al. 2025", "0.99 in the advantage; the problems' J undiscounted"),
        S("grouping", "none (a critic)", "Li et al. 2025", "none"),
        S("epochs and minibatches", "not confirmed", "Li et al. 2025", *_EPOCHS),
    ),
    "seeupo": (
        S("advantage", "R - group mean, then the batch z-score (not the group std)", "arXiv:2602.06554, §4 (docs/"
          "method.md §4)", "grae, mean-centred, batch_std"),
        S("ratio", "sequence, per turn, length-normalised", "arXiv:2602.06554, §4", "sequence, per turn, "
          "length-normalised"),
        S("clip", "0.2", "arXiv:2602.06554, experimental set-up", "0.2"),
        S("aggregation and rows", "turn-oriented batches: one row per trajectory and turn", "arXiv:2602.06554, §4",
          "seq_mean_token_mean; one row per turn"),
        S("KL", "k3 (low_var_kl) in the loss, 0.002", "arXiv:2602.06554, experimental set-up",
          "k3 in the loss, 0.002" + _CARD_KL),
        S("discount", "none", "arXiv:2602.06554", "1"),
        S("grouping", "8 rollouts per task", "arXiv:2602.06554, experimental set-up", "G = 4"),
        S("epochs and minibatches", "1 epoch, 1 minibatch per turn", "the reference code (docs/method.md §5)",
          *_EPOCHS),
        S("other", "turns updated in reverse order with the HAPPO factor M; the reference code keys M by position "
          "and clips it to [0.8, 1.2]", "arXiv:2602.06554, §4; docs/method.md §5", "reverse order, M keyed by "
          "trajectory, not clipped (m_factor=happo)", "the positional M is a defect of the reference code "
          "(docs/method.md §5)"),
    ),
}


def definition(name: str) -> tuple[Setting, ...]:
    """The definition table of catalogue algorithm ``name`` (empty for an algorithm outside the catalogue)."""
    return DEFINITIONS.get(name, ())


def departures(name: str) -> list[Setting]:
    """The settings where the toolkit's ``name`` departs from its source."""
    return [s for s in definition(name) if s.departs is not None]


def definition_markdown(name: str, title: str) -> list[str]:
    """``name``'s definition table as markdown lines: what the source publishes, the toolkit, and why it departs."""
    lines = [f"## {name}", "", f"{title}.", "", "| | Published | Source | Toolkit | Departs because |", "|---|---|---|---|---|"]
    for s in definition(name):
        lines.append(f"| {s.aspect} | {s.published} | {s.source} | {s.toolkit} | {s.departs or '—'} |")
    return lines + [""]


def algorithms_markdown() -> str:
    """``docs/algorithms.md``: every catalogue algorithm's definition table (a test keeps the file equal to this)."""
    from seeupo.experiments.scorecard.catalogue import CATALOGUE

    lines = ["# The catalogue's algorithms, setting by setting against their sources", "",
             "Generated from `seeupo/experiments/scorecard/provenance.py` (a test keeps this page equal to it). For each "
             "algorithm of the scorecard's field: what its paper or its authors' code publishes, where, what the "
             "toolkit's preset or plugin does, and why it departs where it does. Where the authors publish more than "
             "one setting the toolkit takes their default and registers the others as presets (`gigpo_std`: GiGPO's "
             "`mode=\"mean_std_norm\"`; `reinforce_pp_baseline`).", "",
             f"Every exact capability runs one protocol: {PROTOCOL}. Each card measures the capabilities that run the "
             "optimizer again at other step sizes and with a quarter of the optimizer steps per update (its protocol sweep).", ""]
    for e in CATALOGUE:
        lines += definition_markdown(e.name, f"{e.title}: {e.paper}")
    return "\n".join(lines)
