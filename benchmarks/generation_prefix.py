"""HF generate with and without the shared prompt prefill (issue 18 §3): k completions of one BFCL-sized prompt.

``HFGenerateEngine(share_prompts=True)`` forwards a prompt once and repeats its key/value cache for
the k completions; ``False`` (the reference path) prefills it k times. Same tokens and log-probs
(tests/llm/test_rollout.py); this measures the wall time of both, alternated, in one run, with the
load average. SmolLM2-135M, float32, 2 threads, a random 5,833-token prompt (the BFCL median first
context), k = 2, ``NEW`` new tokens (default 32).

    python benchmarks/generation_prefix.py
"""

import os
import time

import torch

from seeupo.llm.models import load_smollm2
from seeupo.llm.rollout import HFGenerateEngine, SamplingParams

torch.set_num_threads(2)
model, tok = load_smollm2(dtype=torch.float32)
g = torch.Generator().manual_seed(0)
prompt = torch.randint(10, len(tok), (5833,), generator=g).tolist()
params = SamplingParams(temperature=0.9, max_new_tokens=int(os.environ.get("NEW", "32")), seed=0)
for share in (False, True, False, True):
    engine = HFGenerateEngine(model, tok.pad_token_id, share_prompts=share)
    start, load = time.perf_counter(), os.getloadavg()[0]
    engine.generate([prompt], 2, params)
    print(f"share_prompts={share} k=2 context=5833 new={params.max_new_tokens}: "
          f"{time.perf_counter() - start:.1f} s (load {load:.2f})", flush=True)
