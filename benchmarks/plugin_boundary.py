"""What the plugin boundary costs (issue 23 §1): every registered function called with and without its checks.

:mod:`seeupo.core.boundary` checks each call of an estimator, policy loss, aggregation, turn order and ``M``
factor (type, shape, dtype, device, finite values at valid positions, the loss's gradient, the inputs unchanged).
This script times ``N`` calls of each built-in through the boundary (``call_*``) and directly (``entry.fn``),
interleaved in the same run, and reports microseconds per call and the ratio, for three shapes:

* ``tabular``: a sampled verify batch (4 instances x 4 tasks x G = 4, 2 turns, 2 tokens; float64);
* ``exact``: an exact-mode-sized batch (20,000 rows of 2 tokens; float64);
* ``lm``: a language-model minibatch (64 rows of 512 tokens; float32).

Then, for context, one verify cell (exact mode, 2 turns, GRPO, 6 instances, 8 iterations of 25 optimizer steps)
with the boundary as shipped and with every ``call_*`` replaced by a direct call, and the one-off cost of exact
mode's contract check (:func:`seeupo.core.contract.exact_mode_refusal`, uncached). One intra-op thread.

Usage::

    python benchmarks/plugin_boundary.py [--calls 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

import torch

from seeupo.core import boundary, losses, update
from seeupo.core.batch import SampleBatch
from seeupo.core.config import PRESETS
from seeupo.core.registry import adv_estimator, aggregation, policy_loss, M_FACTORS, TURN_ORDERS


def make_batch(traj: int, turns: int, tokens: int, group: int, dtype: torch.dtype, seed: int = 0) -> SampleBatch:
    gen = torch.Generator().manual_seed(seed)
    n = traj * turns
    rep = lambda x: x.repeat_interleave(turns)  # noqa: E731
    mask = torch.ones(n, tokens, dtype=torch.bool)
    mask[:, tokens // 2 + 1:] = torch.rand(n, 1, generator=gen) < 0.5  # ragged rows
    returns = torch.randint(0, 2, (traj,), generator=gen).to(dtype)
    return SampleBatch(
        traj_id=rep(torch.arange(traj)), group_id=rep(torch.arange(traj) // group), turn=torch.arange(turns).repeat(traj),
        logp_old=-torch.rand(n, tokens, generator=gen, dtype=torch.float64).to(dtype) * mask, token_mask=mask,
        valid=torch.ones(n, dtype=torch.bool), reward=rep(returns), traj_return=rep(returns),
        weight=torch.ones(n, dtype=dtype), instance=rep(torch.arange(traj) // (traj // 4 if traj >= 4 else 1)).clamp_max(3),
    )


def pairs(batch: SampleBatch) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    """(what, direct call, checked call) for each kind of registered function."""
    cfg = PRESETS["grpo"]
    est = adv_estimator("grae")
    adv = est.fn(batch, cfg)
    logp = (batch.logp_old + 0.01).requires_grad_(True)
    loss = policy_loss("ppo")
    agg = aggregation("token_mean")
    n_tokens = batch.token_mask.sum(1).to(batch.logp_old.dtype)
    factor, ratio = torch.ones(batch.num_trajectories, dtype=adv.dtype), torch.full((batch.num_trajectories,), 1.1)
    happo, order = M_FACTORS.get("happo"), TURN_ORDERS.get("reverse")
    return [
        ("advantage estimator (grae)", lambda: est.fn(batch, cfg), lambda: boundary.call_estimator(est, batch, cfg)),
        ("policy loss (ppo)", lambda: loss.fn(logp, batch, adv, cfg), lambda: boundary.call_policy_loss(loss, logp, batch, adv, cfg)),
        ("aggregation (token_mean)", lambda: agg.fn(n_tokens, batch.weight), lambda: boundary.call_aggregation(agg, n_tokens, batch.weight)),
        ("M factor (happo)", lambda: happo.fn(factor, ratio, cfg), lambda: boundary.call_m_factor(happo, factor, ratio, cfg)),
        ("turn order (reverse)", lambda: order.fn(2, cfg, None), lambda: boundary.call_turn_order(order, 2, cfg, None)),
    ]


def per_call(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


@contextlib.contextmanager
def without_boundary() -> Iterator[None]:
    """Every ``call_*`` of the core replaced by the direct call (the toolkit before the boundary)."""
    direct = {
        (update, "call_estimator"): lambda e, b, c, **kw: e.fn(b, c, **kw),
        (update, "call_turn_order"): lambda e, *a: list(e.fn(*a)),
        (update, "call_m_factor"): lambda e, *a: e.fn(*a),
        (losses, "call_policy_loss"): lambda e, *a: e.fn(*a),
        (losses, "call_aggregation"): lambda e, *a: e.fn(*a),
    }
    saved = {key: getattr(*key) for key in direct}
    for (module, name), fn in direct.items():
        setattr(module, name, fn)
    try:
        yield
    finally:
        for (module, name), fn in saved.items():
            setattr(module, name, fn)


def verify_cell_seconds() -> float:
    from seeupo.experiments.verify import QUICK, run_cell, table1_rows

    row = next(r for r in table1_rows(QUICK.exact_epochs) if r.name == "grpo")
    start = time.perf_counter()
    run_cell(row, "MT", "exact", "independent", QUICK)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per timing (default 300)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats; the median is reported (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = {
        "tabular": make_batch(64, 2, 2, 4, torch.float64),
        "exact": make_batch(10_000, 2, 2, 4, torch.float64),
        "lm": make_batch(64, 1, 512, 4, torch.float32),
    }
    print("| shape | function | direct (us/call) | checked (us/call) | overhead (us) | ratio |")
    print("|---|---|---|---|---|---|")
    for shape, batch in shapes.items():
        calls = args.calls if shape != "exact" else max(10, args.calls // 10)
        for what, direct, checked in pairs(batch):
            direct(), checked()  # warm up
            times: dict[str, list[float]] = {"direct": [], "checked": []}
            for _ in range(args.repeats):  # interleaved: both see the same load
                times["direct"].append(per_call(direct, calls))
                times["checked"].append(per_call(checked, calls))
            d, c = statistics.median(times["direct"]), statistics.median(times["checked"])
            print(f"| {shape} | {what} | {d:.1f} | {c:.1f} | {c - d:.1f} | {c / d:.2f} |")
    with_b, without_b = [], []
    verify_cell_seconds()  # warm up
    for i in range(args.repeats):  # alternating which goes first
        for checked in ((True, False) if i % 2 == 0 else (False, True)):
            if checked:
                with_b.append(verify_cell_seconds())
            else:
                with without_boundary():
                    without_b.append(verify_cell_seconds())
    w, wo = statistics.median(with_b), statistics.median(without_b)
    print(f"\nOne verify cell (exact, MT, grpo, quick): {w:.2f} s with the boundary, {wo:.2f} s without "
          f"(ratio {w / wo:.3f}).")
    from seeupo.core import contract

    start = time.perf_counter()
    for name in ("grpo", "seeupo", "rloo"):
        contract._CACHE.clear()
        contract.exact_mode_refusal(PRESETS[name])
    print(f"Exact mode's contract check, once per algorithm: {(time.perf_counter() - start) / 3 * 1e3:.1f} ms.")


if __name__ == "__main__":
    main()
