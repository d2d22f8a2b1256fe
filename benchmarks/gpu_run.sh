#!/usr/bin/env bash
# The GPU benchmarks of issue 24 in one call (`make benchmark-gpu`), each part under its own time limit
# and each result appended to a file under OUT_DIR as it finishes, so that a run cut short still reports:
#   1. gpu_step.py: one training step per (turns, preset, layout) at the BFCL shape (seconds, peak, MFU);
#   2. flex_options.py: the tree attention kernel alone, flex's kernel options and torch's dense kernels;
#   3. generation_gpu.py: HF engine decoding at batch 32, dynamic cache against the static one;
#   4. logprob_memory.py: peak memory of the log-prob paths at Qwen3's vocabulary;
#   5. the tests that need CUDA (flex against the segment kernel, the static cache's CUDA graph, liger);
# on the CPU also layer_kernels.py (the decoder layers' fused kernels against transformers' own).
# SHAPE=tiny DEVICE=cpu is the CPU dry run of the same scripts at small sizes (CI runs it).
# ARMS (gpu_step.py --arms: levers against the defaults in one run), PLAN (--plan) and PROFILE=1
# (--profile: after the plan, the top kernels of one step of its first item) pass through.
set -u
PY=${PYTHON:-python3}
SHAPE=${SHAPE:-qwen3-1.7b}
DEVICE=${DEVICE:-cuda}
OUT=${OUT_DIR:-benchmarks/results}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ "$DEVICE" = cpu ]; then
  STEP=(--context 100 --plan "${PLAN:-2:grpo:prefix_shared,2:seeupo:prefix_shared,2:grpo:per_row}" --deadline 120
        --arms "${ARMS:-default,previous+as_needed+segments}" --checkpointing on)
  LOGPROB=(--rows 256 --hidden 64 --vocab 4096)
else
  STEP=(--deadline 300 --arms "${ARMS:-default}")
  if [ -n "${PLAN:-}" ]; then STEP+=(--plan "$PLAN"); fi
  LOGPROB=()
fi
if [ -n "${PROFILE:-}" ]; then STEP+=(--profile); fi
# On a GPU each part's limit is its share of the session's device time. On the CPU (the dry run CI makes)
# a limit only catches a hang: five times as long (at most 31 min for gpu_step.py), so that a busy
# machine never fails the dry run on time alone; gpu_step.py's --deadline skips steps, it fails none.
if [ "$DEVICE" = cpu ]; then SCALE=5; else SCALE=1; fi
limit() { echo $(( $1 * SCALE )); }
status=0
timeout "$(limit 380)" "$PY" benchmarks/gpu_step.py --shape "$SHAPE" --device "$DEVICE" --out "$OUT/gpu_step.jsonl" "${STEP[@]}" || status=1
if [ "$DEVICE" = cpu ]; then
  FLEX=(--context 100 --turns 1 --group 2 --heads 4 --kv-heads 2 --head-dim 16 --repeats 1)
else
  FLEX=()
fi
timeout "$(limit 150)" "$PY" benchmarks/flex_options.py --device "$DEVICE" --out "$OUT/flex_options.jsonl" "${FLEX[@]}" || status=1
timeout "$(limit 90)" "$PY" benchmarks/generation_gpu.py --shape "$SHAPE" --device "$DEVICE" --out "$OUT/generation_gpu.jsonl" || status=1
timeout "$(limit 45)" "$PY" benchmarks/logprob_memory.py --device "$DEVICE" --out "$OUT/logprob_memory.jsonl" "${LOGPROB[@]}" || status=1
# on a GPU layer_kernels.py runs by itself (about 2 minutes more than this call's 8-minute budget allows)
if [ "$DEVICE" = cpu ]; then
  timeout "$(limit 120)" "$PY" benchmarks/layer_kernels.py --shape tiny --device cpu --context 100 --turns 2 --arms torch,compiled \
    --out "$OUT/layer_kernels.jsonl" || status=1
fi
if [ "$DEVICE" = cuda ]; then
  timeout "$(limit 120)" "$PY" -m pytest -q -rs -p no:cacheprovider tests/llm/test_tree_attention.py tests/llm/test_rollout.py \
    tests/llm/test_logprobs.py tests/llm/test_kernels.py tests/llm/test_trainer.py::test_adamw_is_fused_on_cuda_and_steps_as_the_reference \
    -k "cuda or liger" --tb=short > "$OUT/gpu_tests.txt" 2>&1 || status=1  # the whole output: a traceback comes back
  tail -20 "$OUT/gpu_tests.txt"
fi
exit $status
