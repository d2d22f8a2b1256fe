"""Where `seeupo eval`'s time goes: prefill vs decoding vs the environment (issue 18 §3).

Runs ``seeupo eval ARGS...`` with timing hooks and prints, at the end: the wall time and load
average, the time and count of the model's forwards split into prefill (more than one new token
per row) and decoding steps (one), ``HFGenerateEngine.generate`` per call (prompt lengths, new
tokens, seconds), and the environment's ``reset`` / ``step`` / ``truncate`` (BFCL's executor and
checker run in ``step``). ``--no-reuse`` builds the engine with ``reuse_contexts=False`` (the
reference path). The figures in benchmarks/RESULTS.md (issue 18 §3, context reuse) came from

    python benchmarks/eval_profile.py [--no-reuse] configs/bfcl_smollm2_eval.yaml --max-tasks 1 --k 2 --out DIR
"""

import os
import sys
import time
from collections import defaultdict

from seeupo.cli import main
from seeupo.llm import rollout
from seeupo.llm.envs import bfcl

seconds: dict[str, float] = defaultdict(float)
counts: dict[str, int] = defaultdict(int)
hooked: set[int] = set()


def hook(model) -> None:
    if id(model) in hooked:
        return
    hooked.add(id(model))

    def pre(module, args, kwargs):
        module._began = time.perf_counter()

    def post(module, args, kwargs, out):
        ids = kwargs["input_ids"]
        kind = "prefill" if ids.shape[1] > 1 else "decoding step"
        seconds[kind] += time.perf_counter() - module._began
        counts[kind] += 1
        counts[kind + " tokens"] += ids.numel()

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - began
            counts[name] += 1

    return wrapper


args = sys.argv[1:]
if args[:1] == ["--no-reuse"]:
    args = args[1:]
    init = rollout.HFGenerateEngine.__init__
    rollout.HFGenerateEngine.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "reuse_contexts": False})
generate = rollout.HFGenerateEngine.generate


def generate_and_report(self, prompts, n, params):
    hook(self.model)
    began = time.perf_counter()
    out = generate(self, prompts, n, params)
    print(f"generate: prompts {[len(p) for p in prompts]} x {n}, new {[len(c.token_ids) for g in out for c in g]}: "
          f"{time.perf_counter() - began:.1f} s (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    return out


rollout.HFGenerateEngine.generate = generate_and_report
for name in ("reset", "step", "truncate"):
    if name in vars(bfcl.BFCLEnv):
        setattr(bfcl.BFCLEnv, name, timed(f"env.{name}", vars(bfcl.BFCLEnv)[name]))
began, load = time.perf_counter(), os.getloadavg()[0]
code = main(["eval", *args])
print(f"wall {time.perf_counter() - began:.1f} s, load {load:.2f} -> {os.getloadavg()[0]:.2f}")
for key in sorted(set(seconds) | set(counts)):
    print(f"{key}: {counts[key]}" + (f", {seconds[key]:.1f} s" if key in seconds else ""))
sys.exit(code)
