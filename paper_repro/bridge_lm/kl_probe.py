"""Is the jumping ``actor/kl_loss`` of the demo run the k3 estimator, or a bug? Measured on the bridge.

Trains ``configs/bridge_tiny_seeupo.yaml`` (``--set`` overrides it) and prints one JSON line per
step: the logged ``actor/kl_loss``; for each optimizer step of the update, the k3 estimate it
logged and the k1 estimate on the same tokens (same aggregation), and the largest per-row k3; and
the exact ``KL(pi || pi_ref)`` per turn by enumeration (the bridge's finite action set, invalid
answers lumped into one outcome, so a lower bound; valid answers have probability > 0.99 here),
averaged over the histories the policy reaches, before and after the step.

    PYTHONPATH=. python paper_repro/bridge_lm/kl_probe.py [--set optim.lr=1e-3 ...] > probe.jsonl

The answer is in results.md ("actor/kl_loss"). The probe wraps ``seeupo.core.update``'s KL
functions to see the per-token values; it changes no number of the run.
"""

from __future__ import annotations

import argparse
import json

import torch

import seeupo.core.update as update
from seeupo.llm.config import load_train_config
from seeupo.llm.envs.bridge import BridgeOptions, Spelling, bridge_problem, evaluate, exact_action_probs, with_invalid_action
from seeupo.llm.trainer import Trainer
from seeupo.tabular.exact import reach_probabilities


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/bridge_tiny_seeupo.yaml")
    p.add_argument("--set", nargs="*", default=[], help="config overrides, as seeupo train --set")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = load_train_config(args.config, ["logging.progress=false", *args.set])
    trainer = Trainer(cfg)
    opts = BridgeOptions(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.env.options.items()})
    problem = bridge_problem(opts)
    spelling = Spelling.for_problem(problem, trainer.tokenizer, opts.alphabet)
    augmented = with_invalid_action(problem, opts.invalid_reward)
    reference = trainer.reference._policy

    def exact() -> tuple[list[float], float]:
        with torch.no_grad():
            pi = exact_action_probs(trainer.policy, trainer.tokenizer, problem, spelling)
            ref = exact_action_probs(reference, trainer.tokenizer, problem, spelling)
        reach = reach_probabilities(augmented, pi)
        kl = []
        for t in range(problem.num_turns):
            p_t, q_t = pi[t].double(), ref[t].double()
            per_history = torch.where(p_t > 0, p_t * (p_t.clamp_min(1e-300).log() - q_t.clamp_min(1e-300).log()), 0.0).sum(-1)
            kl.append(float((reach[t] * per_history).sum() / reach[t].sum()))
        return kl, float(evaluate(augmented, pi).J[0])

    kl_penalty, aggregate = update.kl_penalty, update.aggregate
    last: dict = {}
    calls: list[dict] = []

    def probed_kl(logp, logp_ref, estimator):
        out = kl_penalty(logp, logp_ref, estimator)
        last.update(values=out, logp=logp.detach(), logp_ref=logp_ref.detach())
        return out

    def probed_aggregate(values, batch, mode, coef=None):
        result = aggregate(values, batch, mode, coef)
        if values is last.get("values"):  # the KL term's aggregation
            real = batch.token_mask & batch.valid[:, None]
            rows = real.any(1)
            k3 = torch.where(real, values.detach(), 0.0)
            calls.append({"k3": float(result.detach()),
                          "k1": float(aggregate(last["logp"] - last["logp_ref"], batch, mode, coef)),
                          "row_k3_max": float((k3.sum(1) / real.sum(1).clamp_min(1))[rows].max()),
                          "tokens_per_row": float(real.sum(1)[rows].double().mean()), "rows": int(rows.sum())})
        return result

    update.kl_penalty, update.aggregate = probed_kl, probed_aggregate
    for _ in range(cfg.steps):
        kl_before, j_before = exact()
        calls.clear()
        metrics = trainer.step()
        kl_after, j_after = exact()
        print(json.dumps({"step": trainer.step_count, "actor/kl_loss": metrics["actor/kl_loss"], "J_before": j_before,
                          "J_after": j_after, "exact_kl_per_turn_before": kl_before, "exact_kl_per_turn_after": kl_after,
                          "optimizer_steps": calls}), flush=True)


if __name__ == "__main__":
    main()
