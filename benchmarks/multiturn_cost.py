"""What one training step of each preset costs on a BFCL-shaped multi-turn batch, per pass type (issue 18 §4).

The batch is built as the agent loop builds it (:func:`seeupo.llm.agent.rollout`): one row per
(trajectory, turn), each row the turn's whole context + its response, turn ``k+1``'s context =
turn ``k``'s context + response + observation, so the rows of a trajectory are prefixes of its
later rows; the ``--group`` rollouts of a task share its first context (the prompt). Token ids are
random ids of the model's vocabulary. Defaults are the BFCL shape: first context 5,833 tokens (the
measured median BFCL prompt), responses of 150 and observations of 200 tokens, 8 rollouts per
task. ``--early-end F``: the first ``round(F * group)`` rollouts of each task end at a random earlier
turn, and their later rows are placeholders (``valid=False``, no tokens), as in the agent loop.

One step, as :meth:`seeupo.llm.trainer.Trainer.update` makes it, for each preset (the paper's
settings: ``group_size`` 8, ``kl_coef`` 0.002; ``--epochs`` / ``--minibatches``, default 1 x 1), with
these pass types:

* ``logp_old``: rescoring the rollout's log-probabilities (no gradient), unless the update is one
  optimizer step (1 x 1, the default), which scores them in its own passes
  (:func:`seeupo.core.update.is_on_policy`; ``measure_step(rescore=True)`` forces the pass);
* ``reference``: the reference model's log-probabilities for the KL term (no gradient);
* ``critic_values``: the critic's values for GAE (``ppo`` only; no gradient);
* ``update``: the forward + backward passes of the optimizer steps of
  :func:`seeupo.core.update.policy_update` (token counts are of the forward; the backward runs
  over the same tokens);
* ``m_ratio``: the no-gradient ratio passes of a sequential update that advance ``M``'s factor
  (``seeupo-unfused``, the reference sweep; none after the last turn). ``seeupo`` (the default,
  :meth:`seeupo.core.execution.GradientSteps.fused`) takes each turn's ratio in the next turn's
  first optimizer step, so its ratio passes are part of ``update``;
* ``critic_update``: the critic's value-loss forward + backward (``ppo``).

Measured per pass type and per step:

* **tokens forwarded, exact**: a forward pre-hook on each model's backbone (policy, reference,
  critic) adds the real tokens the call computes (:func:`seeupo.llm.tree_attention.call_tokens`:
  a packed row's real tokens, or the sum of a 2-D attention mask; all input positions without one). These counts depend only on the batch and on the
  layout the policy uses, not on the hardware. ``padded`` also counts the padding positions
  (``input_ids.numel()``: right-padded rows, or the flex kernel's padding of a packed row to a
  multiple of 128), the work a dense kernel does. No data parallelism here, so no dummy
  passes (under torchrun each would count 1 token). The per-row arithmetic (the sum over rows of
  context + response) is printed next to the counts, per pass type, as a check;
* **wall time** (``time.perf_counter``, CUDA synchronised). ``update`` = the time of
  ``policy_update`` minus its ``m_ratio`` calls (the no-gradient ``token_logps`` calls made
  inside it, timed by wrapping the policy's ``token_logps``);
* **peak memory**: on CUDA, ``torch.cuda.max_memory_allocated`` of each pass type (reset before
  each); on the CPU the process's peak RSS (``ru_maxrss``) at the end of each pass type: a running
  maximum, so a pass type raised the peak where the number grows. Each (preset, layout) runs in
  its own subprocess, so that these peaks do not carry over (as ``benchmarks/peak_memory.py``).

Layouts: ``--scoring per_row,packed`` builds ``CausalLMPolicy(..., scoring=layout)``, and the
reference and the critic with the same layout. The
layouts of one preset run back to back in the same invocation, so their ratios compare runs made
under the same load.

``--count-only``: the exact token counts at any shape, in about a minute: the same policy code with a
model of the same configuration but 0 transformer layers (embedding, final norm and head), so every
pass runs (backward included) and is counted as usual; times and memory are not reported.

Results go to ``benchmarks/results/multiturn_cost_T<turns>[_context<C>][_early<F>][_count].json``; the section "Multi-turn
cost per step (issue 18)" of ``benchmarks/RESULTS.md`` is written by hand from them. Usage::

    python benchmarks/multiturn_cost.py --model tiny-qwen3 --turns 5 --count-only
    python benchmarks/multiturn_cost.py --model tiny-qwen3 --turns 10 --context 1000
    python benchmarks/multiturn_cost.py --shape qwen3-1.7b --dtype bfloat16 --device cuda --turns 10   # a GPU
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

# "seeupo-unfused": seeupo with the reference sweep (a no-gradient ratio pass per turn, UpdateSettings.fuse_ratio_passes=False)
PRESETS = ("ppo", "grpo", "gspo", "rloo", "seeupo", "seeupo-unfused")
LAYOUTS = ("per_row", "packed", "prefix_shared")
PASS_TYPES = ("logp_old", "reference", "critic_values", "update", "m_ratio", "critic_update")


def bfcl_batch(
    vocab: int,
    low: int,
    *,
    tasks: int,
    group: int,
    turns: int,
    context: int,
    response: int,
    observation: int,
    early_end: float = 0.0,
    pad_token_id: int = 0,
    seed: int = 0,
):
    """A multi-turn batch in the agent loop's layout (module docstring); returns ``(batch, turns_taken)``.

    Trajectory ``b * group + g`` is rollout ``g`` of task ``b`` (``group_id = b``), rows
    trajectory-major (row ``traj * turns + t``). Turn ``t``'s context is ``context + t * (response +
    observation)`` tokens and its row ``response`` tokens longer. ``turns_taken[traj]`` is the number
    of turns the trajectory took (its later rows are placeholders). Token ids are drawn from
    ``[low, vocab)``; rewards are 0/1 at each trajectory's last turn.
    """
    from seeupo.core.batch import SampleBatch

    from seeupo.llm.layout import pack_rows

    g = torch.Generator().manual_seed(seed)
    draw = lambda k: torch.randint(low, vocab, (k,), generator=g).tolist()  # noqa: E731
    n_traj, n = tasks * group, tasks * group * turns
    ended = round(early_end * group)
    contexts: list[list[int]] = []
    responses: list[list[int]] = []
    turns_taken: list[int] = []
    valid = torch.zeros(n, dtype=torch.bool)
    reward = torch.zeros(n, dtype=torch.float32)
    success = (torch.rand(n_traj, generator=g) < 0.5).to(torch.float32)
    for b in range(tasks):
        prompt = draw(context)  # the task's prompt: shared by its rollouts
        for r in range(group):
            k = b * group + r
            taken = int(torch.randint(1, turns, (1,), generator=g)) if r < ended and turns > 1 else turns
            turns_taken.append(taken)
            ctx = list(prompt)
            for t in range(turns):
                if t >= taken:
                    contexts.append([])
                    responses.append([])
                    continue
                resp = draw(response)
                contexts.append(list(ctx))
                responses.append(resp)
                valid[k * turns + t] = True
                ctx = ctx + resp + draw(observation)  # the agent loop appends and never re-encodes
            reward[k * turns + taken - 1] = success[k]
    token_mask = torch.zeros(n, response, dtype=torch.bool)
    token_mask[valid] = True
    rep = lambda x: x.repeat_interleave(turns)  # noqa: E731
    batch = SampleBatch(
        traj_id=rep(torch.arange(n_traj)), group_id=rep(torch.arange(n_traj) // group),
        turn=torch.arange(turns).repeat(n_traj), logp_old=torch.zeros(n, response), token_mask=token_mask,
        valid=valid, reward=reward, traj_return=rep(success), weight=torch.ones(n),
        instance=torch.zeros(n, dtype=torch.long),  # as the agent loop sets it
        data=pack_rows(contexts, responses, pad_token_id),
    )
    return batch, turns_taken


def row_lengths(turns_taken: list[int], turns: int, context: int, response: int, observation: int) -> list[list[int]]:
    """``[traj][t]``: context + response tokens of each valid row, by arithmetic (0 for placeholders)."""
    return [[context + t * (response + observation) + response if t < taken else 0 for t in range(turns)]
            for taken in turns_taken]


def per_row_expectation(lengths: list[list[int]], cfg, fuse: bool = True) -> dict[str, int]:
    """The tokens each pass type forwards in the per-row layout, by arithmetic from ``lengths``.

    Every scoring pass forwards every valid row once (the policy's ``logp_old`` pass only where
    the update is not one optimizer step: :func:`~seeupo.core.update.is_on_policy`); the update forwards every row ``epochs``
    times (minibatches partition the rows); a sequential update's ratio passes forward every
    turn's rows but the last turn's of its order: in separate passes (``fuse=False`` or a schedule
    that cannot fuse), or in the next turn's first optimizer step (the update then forwards them).
    """
    from seeupo.core.registry import adv_estimator
    from seeupo.core.update import is_on_policy, steps_per_turn, turn_order

    turns = len(lengths[0])
    total = sum(map(sum, lengths))
    by_turn = [sum(row[t] for row in lengths) for t in range(turns)]
    out = {"logp_old": 0 if is_on_policy(cfg) else total, "reference": total if cfg.kl_coef > 0 else 0}
    critic = adv_estimator(cfg.advantage).needs_critic
    out["critic_values"] = out["critic_update"] = total if critic else 0
    if cfg.schedule == "simultaneous":
        out["update"], out["m_ratio"] = cfg.epochs * total, 0
    else:
        epochs, _ = steps_per_turn(cfg, turns)
        out["update"] = epochs * total
        out["m_ratio"] = total - by_turn[turn_order(cfg, turns, torch.Generator().manual_seed(0))[-1]]
        if fuse and steps_per_turn(cfg, turns)[1] == 1:  # can_fuse_ratio_passes, for the presets here
            out["update"], out["m_ratio"] = out["update"] + out["m_ratio"], 0
    return out


def packed_expectation(lengths: list[list[int]]) -> int:
    """Tokens of one pass that forwards each trajectory's longest row once (trajectory packing)."""
    return sum(max(row) for row in lengths)


class PassCounter:
    """Counts the tokens each backbone forward call computes, under the current ``phase``."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.tokens: dict[str, int] = {}
        self.padded: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.pairs: dict[str, int] = {}  # (query, key) pairs of causal attention (model FLOPs)
        self.reads: dict[str, int] = {}  # response tokens scored (the LM head's positions)

    def hook(self, module, args, kwargs) -> None:
        from seeupo.llm.tree_attention import attention_pairs, call_tokens

        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        if ids is None:
            ids = kwargs["inputs_embeds"][..., 0]
        real, padded = call_tokens(ids, mask)
        for d, v in ((self.tokens, real), (self.padded, padded), (self.calls, 1), (self.pairs, attention_pairs(ids, mask))):
            d[self.phase] = d.get(self.phase, 0) + v

    def attach(self, backbone: torch.nn.Module):
        return backbone.register_forward_pre_hook(self.hook, with_kwargs=True)


def zero_layer_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A model of ``model``'s configuration with 0 transformer layers (for ``--count-only``)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    config.num_hidden_layers = 0
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = []
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype).eval()


def measure_step(model: torch.nn.Module, batch, cfg, layout: str | None, *, temperature: float = 0.9,
                 micro_batch_rows: int | None = 8, micro_batch_tokens: int | None = None, timed: bool = True,
                 fuse: bool = True, logprobs: str = "auto", rescore: bool | None = None, fused_adamw: bool = True,
                 memory_share: float | None = None) -> dict:
    """One training step of ``cfg`` on ``batch`` (as the trainer's ``update`` makes it), measured per pass type.

    ``layout``: the ``scoring`` argument of the policy, the reference and the critic (for the
    classes that take one); ``None`` passes none. ``logprobs``: the policy's and the reference's
    log-prob path (:mod:`seeupo.llm.logprobs`). ``model`` is left unchanged (the step trains a
    deep copy). Returns ``{"tokens", "padded", "calls", "seconds", "peak_mib", "optimizer_steps",
    "scoring_passed_to"}``, the first five keyed by pass type (only the pass types the step makes).
    ``rescore``: score ``logp_old`` in a pass of its own before the update; ``None``, as the trainer
    does: unless the update is one optimizer step (:func:`~seeupo.core.update.is_on_policy`), which
    scores them in its own passes. ``fused_adamw``: the trainer's AdamW (fused on CUDA,
    :func:`seeupo.llm.trainer.adamw`); ``False``: torch's default (per-tensor-list passes).
    ``memory_share``: ``parallel.memory_share`` of every model (``None``: the default).
    """
    from seeupo.core.registry import adv_estimator
    from seeupo.core.update import UpdateSettings, compute_advantages, is_on_policy, policy_update
    from seeupo.llm.policy import CausalLMPolicy, ReferencePolicy, ValueModel, clipped_value_loss
    from seeupo.llm.trainer import adamw

    model = copy.deepcopy(model)
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    extra = lambda cls: {"scoring": layout} if layout is not None else {}  # noqa: E731
    passed = [cls.__name__ for cls in (CausalLMPolicy, ReferencePolicy, ValueModel) if extra(cls)]
    counter = PassCounter()
    limits = dict(micro_batch_rows=micro_batch_rows, micro_batch_tokens=micro_batch_tokens)  # every pass, as the trainer
    if memory_share is not None:
        limits["memory_share"] = memory_share
    policy = CausalLMPolicy(model, temperature=temperature, logprobs=logprobs, **limits, **extra(CausalLMPolicy))
    hooks = [counter.attach(model.base_model)]
    reference = critic = None
    if cfg.kl_coef > 0:
        reference = ReferencePolicy(model, temperature=temperature, logprobs=logprobs, **limits,
                                    **extra(ReferencePolicy))
        hooks.append(counter.attach(reference.model.base_model))
    if adv_estimator(cfg.advantage).needs_critic:
        critic = ValueModel.from_causal_lm(model, **limits, **extra(ValueModel))
        hooks.append(counter.attach(critic.backbone))
    make_adamw = adamw if fused_adamw else torch.optim.AdamW
    optimizer = make_adamw(policy.parameters(), lr=1e-6)
    critic_optimizer = make_adamw(critic.parameters(), lr=1e-5) if critic is not None else None

    seconds: dict[str, float] = {}
    peak: dict[str, float] = {}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def phase(name: str):
        counter.phase = name
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        sync()
        return time.perf_counter()

    def done(name: str, start: float) -> None:
        sync()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        peak[name] = (torch.cuda.max_memory_allocated(device) if cuda
                      else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**20

    # the no-gradient token_logps calls inside policy_update are the ratio passes of M
    inner = policy.token_logps
    ratio_seconds = [0.0]

    def token_logps(b):
        reads = int(b.token_mask[b.valid].sum())
        if torch.is_grad_enabled():
            counter.phase = "update"
            counter.reads["update"] = counter.reads.get("update", 0) + reads
            return inner(b)
        counter.phase = "m_ratio"
        counter.reads["m_ratio"] = counter.reads.get("m_ratio", 0) + reads
        sync()
        start = time.perf_counter()
        out = inner(b)
        sync()
        ratio_seconds[0] += time.perf_counter() - start
        counter.phase = "update"
        return out

    rescore = not is_on_policy(cfg) if rescore is None else rescore
    with torch.no_grad():
        if rescore:
            start = phase("logp_old")
            batch = batch.with_updates(logp_old=policy.token_logps(batch))
            done("logp_old", start)
        logp_ref = values = None
        if reference is not None:
            start = phase("reference")
            logp_ref = reference.logp_ref(batch)
            done("reference", start)
        if critic is not None:
            start = phase("critic_values")
            values = critic.values(batch)
            done("critic_values", start)
    advantages = compute_advantages(batch, cfg, critic_values=values)
    policy.token_logps = token_logps
    start = phase("update")
    stats = policy_update(policy, optimizer, batch, advantages, cfg, UpdateSettings(
        logp_ref=logp_ref, generator=torch.Generator().manual_seed(0), micro_batch_rows=micro_batch_rows,
        micro_batch_tokens=micro_batch_tokens,
        row_tokens=batch.data["attention_mask"].sum(1), max_grad_norm=1.0, fuse_ratio_passes=fuse,
        old_logps_from_update=not rescore))
    done("update", start)
    del policy.token_logps
    if "m_ratio" in counter.tokens:
        seconds["update"] -= ratio_seconds[0]
        seconds["m_ratio"] = ratio_seconds[0]
        peak["m_ratio"] = peak["update"]  # interleaved with the update: one peak for both
    if critic is not None:  # the trainer's _update_critic: the clipped value loss towards A + V_old
        start = phase("critic_update")
        real = batch.token_mask & batch.valid[:, None]
        loss = clipped_value_loss(critic.values(batch), values, (advantages + values).detach(), real)
        critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
        critic_optimizer.step()
        done("critic_update", start)
    for h in hooks:
        h.remove()
    order = [p for p in PASS_TYPES if p in counter.tokens]
    result = {
        "tokens": {p: counter.tokens[p] for p in order}, "padded": {p: counter.padded[p] for p in order},
        "calls": {p: counter.calls[p] for p in order}, "optimizer_steps": stats.steps, "scoring_passed_to": passed,
        "attention_pairs": {p: counter.pairs[p] for p in order}, "reads": dict(counter.reads),
        "token_budget": {"policy": policy.auto_budget(), "reference": reference.auto_budget() if reference else None},
    }
    if timed:
        result["seconds"] = {p: seconds[p] for p in order}
        result["peak_mib"] = {p: peak[p] for p in order}
    return result


def shape_model(shape: str, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.nn.Module:
    """A randomly initialised Qwen3 of a released model's shape (``gpu_train.SHAPES``: ``qwen3-1.7b``, ...),
    initialised on ``device`` (on a GPU in seconds; a 1.7B model on the CPU takes over a minute)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    sys.path.insert(0, str(HERE))
    from gpu_train import SHAPES

    torch.manual_seed(0)
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=65536)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _setup(args: argparse.Namespace):
    """The model (0 layers with ``--count-only``), the batch and the per-row row lengths."""
    from seeupo.llm.build import load_model

    dtype = getattr(torch, args.dtype)
    if args.shape is not None:  # random weights of a real shape: token ids anywhere past the first few
        model, pad, low = shape_model(args.shape, dtype), 0, 10
        vocab = model.config.vocab_size
    else:
        model, tokenizer = load_model(args.model, args.dtype, 0)
        vocab, pad = min(model.config.vocab_size, len(tokenizer)), tokenizer.pad_token_id or 0
        low = len(tokenizer.all_special_ids) + 3  # skip the special ids at the start of the vocabularies used here
    if args.count_only:
        model = zero_layer_copy(model)
    model = model.to(args.device)
    batch, taken = bfcl_batch(vocab, low, tasks=args.tasks, group=args.group, turns=args.turns, context=args.context,
                              response=args.response, observation=args.observation, early_end=args.early_end,
                              pad_token_id=pad, seed=args.seed)
    return model, batch, row_lengths(taken, args.turns, args.context, args.response, args.observation)


def _config(name: str, args: argparse.Namespace):
    from seeupo.core.config import preset

    return preset(name.removesuffix("-unfused"), group_size=args.group, kl_coef=0.002, epochs=args.epochs,
                  minibatches=args.minibatches)


def _fused(name: str) -> bool:
    """Whether the step fuses a sequential update's ratio passes (all but the ``-unfused`` variant)."""
    return not name.endswith("-unfused")


def child(args: argparse.Namespace) -> dict:
    """One (preset, layout) measurement (``--child preset:layout``)."""
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    name, layout = args.child.split(":")
    model, batch, _ = _setup(args)
    setup_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    out = measure_step(model, batch, _config(name, args), layout,
                       micro_batch_rows=args.micro_batch_rows, micro_batch_tokens=args.micro_batch_tokens,
                       timed=not args.count_only, fuse=_fused(name))
    out |= {"preset": name, "layout": layout, "step_seconds": time.perf_counter() - start,
            "setup_peak_rss_mib": setup_mib, "load_average_1min": os.getloadavg()[0]}
    return out


def _child_argv(argv: list[str]) -> list[str]:
    """``argv`` without ``--presets``/``--scoring`` and their values (the child gets ``--child``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--presets", "--scoring", "--no-record"):
            skip = a != "--no-record"
            continue
        if a.startswith(("--presets=", "--scoring=")):
            continue
        out.append(a)
    return out


def _parse_list(value: str, choices: tuple[str, ...], flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in choices]
    if bad or not items:
        print(f"error: {flag} takes a comma-separated list of {', '.join(choices)}; got {value!r}", file=sys.stderr)
        sys.exit(2)
    return items


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-qwen3")
    p.add_argument("--shape", default=None, help="instead of --model: a random Qwen3 of a real shape (qwen3-1.7b, qwen3-8b)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the models' dtype (GPU: bfloat16)")
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    p.add_argument("--scoring", default=",".join(LAYOUTS), help="comma-separated layouts (CausalLMPolicy's scoring)")
    p.add_argument("--tasks", type=int, default=1, help="tasks per step, each rolled out --group times")
    p.add_argument("--group", type=int, default=8, help="rollouts per task (group_size)")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--context", type=int, default=5833, help="first turn's context tokens (the BFCL median prompt)")
    p.add_argument("--response", type=int, default=150)
    p.add_argument("--observation", type=int, default=200)
    p.add_argument("--early-end", type=float, default=0.0,
                   help="fraction of each task's rollouts that end at a random earlier turn (placeholder rows)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--minibatches", type=int, default=1)
    p.add_argument("--micro-batch-rows", type=int, default=8, help="rows forwarded per pass (optim.micro_batch_rows)")
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="tokens forwarded per pass (optim.micro_batch_tokens)")
    p.add_argument("--count-only", action="store_true", help="exact token counts only, with a 0-layer model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads on the CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-record", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    for flag, value, least in (("--tasks", args.tasks, 1), ("--group", args.group, 1), ("--turns", args.turns, 1),
                               ("--context", args.context, 1), ("--response", args.response, 1),
                               ("--observation", args.observation, 0), ("--epochs", args.epochs, 1),
                               ("--minibatches", args.minibatches, 1)):
        if value < least:
            print(f"error: {flag} must be >= {least}, got {value}", file=sys.stderr)
            sys.exit(2)
    shapes = ("qwen3-1.7b", "qwen3-8b", "tiny")  # benchmarks/gpu_train.py's SHAPES
    if args.shape is not None and args.shape not in shapes:
        print(f"error: --shape takes one of {', '.join(shapes)}; got {args.shape!r}", file=sys.stderr)
        sys.exit(2)
    if not 0.0 <= args.early_end <= 1.0:
        print(f"error: --early-end must be in [0, 1], got {args.early_end}", file=sys.stderr)
        sys.exit(2)
    if args.child is not None:
        print(json.dumps(child(args)), flush=True)
        return {}
    presets = _parse_list(args.presets, PRESETS, "--presets")
    layouts = _parse_list(args.scoring, LAYOUTS, "--scoring")

    note = None  # a remark about the run, kept in its JSON record
    _, batch, lengths = _setup(argparse.Namespace(**(vars(args) | {"count_only": True})))
    rows = int(batch.valid.sum())
    print(f"batch: {args.tasks} task(s) x {args.group} rollouts x {args.turns} turns = {batch.num_rows} rows "
          f"({rows} valid), first context {args.context}, response {args.response}, observation {args.observation}; "
          f"per-row tokens per pass (sum of context + response) {sum(map(sum, lengths)):,}, "
          f"each trajectory's longest row once {packed_expectation(lengths):,}", flush=True)

    results = []
    loads = [os.getloadavg()[0]]
    started = time.perf_counter()
    for name in presets:
        expected = per_row_expectation(lengths, _config(name, args), _fused(name))
        for layout in layouts:
            cmd = [sys.executable, str(Path(__file__).resolve()), *_child_argv(argv), "--child", f"{name}:{layout}"]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name}:{layout} failed (exit {out.returncode})")
            record = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
            record["expected_per_row"] = {k: v for k, v in expected.items() if k in record["tokens"]}
            results.append(record)
            loads.append(record["load_average_1min"])
            print(_line(record), flush=True)
    total_s = time.perf_counter() - started
    print(f"benchmark wall time {total_s:.1f} s (1-min load {min(loads):.2f}-{max(loads):.2f})")
    for line in _ratios(results):
        print(line)
    record = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "multiturn_cost.py",
        "settings": {k: v for k, v in vars(args).items() if k != "child"}, "note": note, "rows": batch.num_rows,
        "valid_rows": rows, "per_row_tokens_per_pass": sum(map(sum, lengths)),
        "packed_tokens_per_pass": packed_expectation(lengths), "results": results, "ratios": _ratios(results),
        "benchmark_seconds": total_s, "load_average_1min": loads, "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "platform": platform.platform(),
    }
    if not args.no_record:
        (HERE / "results").mkdir(exist_ok=True)
        tag = ((f"{args.shape}_" if args.shape else "") + f"T{args.turns}" + (f"_context{args.context}" if args.context != 5833 else "")
               + (f"_early{args.early_end:g}" if args.early_end else "") + ("_count" if args.count_only else ""))
        (HERE / "results" / f"multiturn_cost_{tag}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _line(r: dict) -> str:
    """One (preset, layout)'s numbers on one line."""
    parts = []
    for p, tokens in r["tokens"].items():
        s = f"{p} {tokens:,}"
        if r["layout"] == "per_row":
            s += f" (arith {r['expected_per_row'][p]:,})"
        if "seconds" in r:
            s += f" {r['seconds'][p]:.2f}s {r['peak_mib'][p]:.0f}MiB"
        parts.append(s)
    step = sum(r["tokens"].values())
    timing = f", {sum(r['seconds'].values()):.2f} s" if "seconds" in r else ""
    line = f"{r['preset']:>6} {r['layout']:>7}: step {step:,} tokens{timing} | " + "; ".join(parts)
    if r["scoring_passed_to"] != ["CausalLMPolicy", "ReferencePolicy", "ValueModel"]:
        # a class without the parameter scores in its own (only) layout
        line += f" [scoring passed to {', '.join(r['scoring_passed_to']) or 'none'}]"
    return line


def _ratios(results: list[dict]) -> list[str]:
    """per_row / each other layout per preset, and SeeUPO against GRPO in each layout (tokens and, if timed, seconds)."""
    by = {(r["preset"], r["layout"]): r for r in results}
    tok = lambda r: sum(r["tokens"].values())  # noqa: E731
    sec = lambda r: sum(r["seconds"].values()) if "seconds" in r else None  # noqa: E731
    lines = []
    for name in dict.fromkeys(r["preset"] for r in results):
        for layout in LAYOUTS[1:]:
            a, b = by.get((name, "per_row")), by.get((name, layout))
            if a and b:
                line = f"{name}: per_row/{layout} tokens x{tok(a) / tok(b):.2f}"
                if sec(a) is not None:
                    line += f", seconds x{sec(a) / sec(b):.2f}"
                lines.append(line)
    for layout in dict.fromkeys(r["layout"] for r in results):
        s, g = by.get(("seeupo", layout)), by.get(("grpo", layout))
        if s and g:
            line = f"seeupo/grpo ({layout}): tokens x{tok(s) / tok(g):.2f}"
            if sec(s) is not None:
                line += f", seconds x{sec(s) / sec(g):.2f}"
            lines.append(line)
    for layout in LAYOUTS[1:]:
        s, g = by.get(("seeupo", layout)), by.get(("grpo", "per_row"))
        if s and g:
            lines.append(f"seeupo {layout} / grpo per_row: tokens x{tok(s) / tok(g):.2f}")
    return lines


if __name__ == "__main__":
    main()
