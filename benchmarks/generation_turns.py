"""HF generate with and without reusing a context's key/values across turns (issue 18 §3): one BFCL-sized episode.

``HFGenerateEngine(reuse_contexts=True)`` keeps each sequence's key/values after a call and, when
the next turn's context extends it, forwards only the appended tokens; ``False`` (the reference
path) prefills every turn's whole context. Same tokens and log-probs (tests/llm/test_rollout.py).
This times ``TURNS`` turns (default 3) of k = 2 trajectories: turn 0 samples 2 responses of a
random 5,833-token prompt (the BFCL median first context), each later turn appends the response
and a random 200-token observation to each trajectory's context and samples one response. Both
paths, alternated, in one run, with the load average. SmolLM2-135M, float32, 2 threads, ``NEW``
new tokens per response (default 32), temperature 0.9.

    python benchmarks/generation_turns.py
"""

import os
import time

import torch

from seeupo.llm.models import load_smollm2
from seeupo.llm.rollout import HFGenerateEngine, SamplingParams

torch.set_num_threads(2)
model, tok = load_smollm2(dtype=torch.float32)
turns, new = int(os.environ.get("TURNS", "3")), int(os.environ.get("NEW", "32"))
for reuse in (False, True, False, True):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, len(tok), (5833,), generator=g).tolist()
    engine = HFGenerateEngine(model, tok.pad_token_id, reuse_contexts=reuse)
    times, start, load = [], time.perf_counter(), os.getloadavg()[0]
    for t in range(turns):
        params = SamplingParams(temperature=0.9, max_new_tokens=new, seed=t)
        began = time.perf_counter()
        if t == 0:
            contexts = [prompt, prompt]
            out = [c for c in engine.generate([prompt], 2, params)[0]]
        else:
            out = [group[0] for group in engine.generate(contexts, 1, params)]
        times.append(time.perf_counter() - began)
        observation = [torch.randint(10, len(tok), (200,), generator=g).tolist() for _ in out]
        contexts = [c + o.token_ids + x for c, o, x in zip(contexts, out, observation)]
    print(f"reuse_contexts={reuse} k=2 turns={turns} new={new} last context={len(contexts[0]) - 200}: "
          f"{time.perf_counter() - start:.1f} s, per turn {', '.join(f'{x:.1f}' for x in times)} s "
          f"(load {load:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)
