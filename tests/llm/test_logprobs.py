"""seeupo.llm.logprobs: the chunked (and liger) token log-probabilities against the plain reference."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seeupo.llm.logprobs import (
    default_chunk_rows,
    head_of,
    head_unsupported,
    liger_unavailable,
    logprob_backend,
    token_entropies,
    token_entropies_reference,
    token_logprobs_chunked,
    token_logprobs_reference,
)


def problem(n: int, h: int, v: int, dtype: torch.dtype, seed: int = 0, bias: bool = True):
    """``(hidden, weight, bias, target)`` with logits of unit spread, all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=gen, dtype=torch.float64) / math.sqrt(h)).to(dtype).requires_grad_()
    b = torch.randn(v, generator=gen, dtype=torch.float64).to(dtype).requires_grad_() if bias else None
    target = torch.randint(v, (n,), generator=gen)
    return hidden, weight, b, target


def values_and_grads(fn, hidden, weight, bias, target, temperature, **kwargs):
    """``fn``'s values and the gradients of ``sum(g * logp)`` (a fixed random ``g``) w.r.t. hidden, weight, bias."""
    logp = fn(hidden, weight, target, temperature, bias, **kwargs)
    g = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g = g.to(logp.device, logp.dtype)
    inputs = [x for x in (hidden, weight, bias) if x is not None and x.requires_grad]
    return logp.detach(), torch.autograd.grad((g * logp).sum(), inputs)


def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 20, 50])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_reference_float64(chunk_rows, temperature):
    # N = 20: chunks of 3 and 7 leave a short last chunk, 50 is one chunk larger than N
    hidden, weight, bias, target = problem(20, 16, 97, torch.float64)
    ref, ref_grads = values_and_grads(token_logprobs_reference, hidden, weight, bias, target, temperature)
    out, grads = values_and_grads(token_logprobs_chunked, hidden, weight, bias, target, temperature,
                                  chunk_rows=chunk_rows)
    assert out.dtype == torch.float64 and out.shape == (20,)
    assert max_gap(out, ref) < 1e-12
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float64
        assert max_gap(got, want) < 1e-12
    assert bool((ref < 0).all()) and ref.min() > -20  # real log-probabilities, not a degenerate case


def test_chunked_equals_reference_float32():
    hidden, weight, bias, target = problem(37, 32, 500, torch.float32)
    ref, ref_grads = values_and_grads(token_logprobs_reference, hidden, weight, bias, target, 0.7)
    out, grads = values_and_grads(token_logprobs_chunked, hidden, weight, bias, target, 0.7, chunk_rows=5)
    assert out.dtype == torch.float32
    assert max_gap(out, ref) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert max_gap(got, want) < 1e-5


def test_chunked_bfloat16_close_to_reference():
    """bf16 hidden and weight: the logits are the same bf16 numbers, so the float32 values agree to
    float32 rounding and the hidden gradient is the same bf16 product; the head's gradient is one
    bf16 product per chunk summed in float32 (the reference: one product over all rows), the
    bias's a float32 sum. Measured over 8 seeds (gaps relative to the largest entry): values
    <= 1.9e-6 absolute, grad hidden 0, grad weight / bias <= 5.4e-3 / 5.9e-3 from the reference;
    against the float64 truth on the same inputs <= 5.5e-3 / 7.0e-3 (the reference's own: 4.5e-3 / 7.8e-3)."""
    hidden, weight, bias, target = problem(64, 64, 1000, torch.bfloat16)
    ref, ref_grads = values_and_grads(token_logprobs_reference, hidden, weight, bias, target, 0.7)
    out, grads = values_and_grads(token_logprobs_chunked, hidden, weight, bias, target, 0.7, chunk_rows=9)
    assert out.dtype == torch.float32
    assert max_gap(out, ref) < 1e-5
    assert max_gap(grads[0], ref_grads[0]) <= 2**-8 * ref_grads[0].abs().max().item()  # at most 1 bf16 ulp
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.bfloat16
        assert max_gap(got, want) <= 2**-6 * want.abs().max().item()  # a few bf16 ulps of the largest entry
    # both are bf16-close to the float64 truth on the same inputs
    exact = [x.detach().double().requires_grad_() for x in (hidden, weight, bias)]
    _, true_grads = values_and_grads(token_logprobs_reference, *exact, target, 0.7)
    for got, want, true in zip(grads, ref_grads, true_grads):
        scale = true.abs().max().item()
        assert max_gap(got, true) <= 2**-6 * scale and max_gap(want, true) <= 2**-6 * scale


def test_hand_computed_two_by_three():
    """2 rows, H = 2, V = 3, tau = 1: logits row 0 = [1, 0, 1] (target 0), row 1 = [0, 2, 2] (target 2)."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    target = torch.tensor([0, 2])
    e = math.e
    want = torch.tensor([1 - math.log(2 * e + 1), 2 - math.log(1 + 2 * e**2)], dtype=torch.float64)
    # d logp_0 / d hidden_0 = W[t] - sum_v p_v W[v], p = [e, 1, e] / (2e + 1)
    want_grad0 = torch.tensor([1 / (2 * e + 1), -(1 + e) / (2 * e + 1)], dtype=torch.float64)
    for fn in (token_logprobs_reference, token_logprobs_chunked):
        logp = fn(hidden, weight, target, 1.0)
        assert max_gap(logp.detach(), want) < 1e-15
        (grad,) = torch.autograd.grad(logp[0], hidden)
        assert max_gap(grad[0], want_grad0) < 1e-15 and bool((grad[1] == 0).all())
    # temperature 0.5 doubles every logit
    half = token_logprobs_chunked(hidden, weight, target, 0.5)
    assert max_gap(half.detach(), torch.tensor([2 - math.log(2 * e**2 + 1), 4 - math.log(1 + 2 * e**4)])) < 1e-15


def test_tied_weight_gradients_add_up():
    """The weight is both the embedding that makes the hidden states and the head: its gradient is the sum."""
    gen = torch.Generator().manual_seed(3)
    embedding = torch.randn(61, 8, generator=gen, dtype=torch.float64).requires_grad_()
    mix = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    ids = torch.randint(61, (23,), generator=gen)
    target = torch.randint(61, (23,), generator=gen)
    grads = []
    for fn, kwargs in ((token_logprobs_reference, {}), (token_logprobs_chunked, {"chunk_rows": 4})):
        hidden = torch.tanh(embedding[ids] @ mix)
        logp = fn(hidden, embedding, target, 0.7, **kwargs)
        grads.append(torch.autograd.grad(logp.sum(), embedding)[0])
    assert max_gap(grads[1], grads[0]) < 1e-12
    # the embedding rows of the ids get gradient through the hidden states too: not the head's part alone
    head_only = torch.autograd.grad(
        token_logprobs_chunked(torch.tanh(embedding[ids] @ mix).detach(), embedding, target, 0.7).sum(), embedding)[0]
    assert max_gap(grads[1], head_only) > 1e-3


def test_frozen_weight_and_no_grad():
    hidden, weight, _, target = problem(11, 8, 40, torch.float64, bias=False)
    weight = weight.detach()  # a frozen reference head
    ref, (ref_grad,) = values_and_grads(token_logprobs_reference, hidden, weight, None, target, 0.7)
    out, (grad,) = values_and_grads(token_logprobs_chunked, hidden, weight, None, target, 0.7, chunk_rows=4)
    assert max_gap(out, ref) < 1e-12 and max_gap(grad, ref_grad) < 1e-12
    with torch.no_grad():
        scored = token_logprobs_chunked(hidden, weight, target, 0.7, chunk_rows=4)
    assert not scored.requires_grad and scored.grad_fn is None
    assert max_gap(scored, ref) < 1e-12


def test_empty():
    hidden, weight, bias, target = problem(0, 8, 40, torch.float32)
    out = token_logprobs_chunked(hidden, weight, target, 0.7, bias)
    assert out.shape == (0,) and out.dtype == torch.float32
    out.sum().backward()
    assert hidden.grad.shape == (0, 8) and bool((weight.grad == 0).all()) and bool((bias.grad == 0).all())


def saved_elements(fn, *args, **kwargs) -> int:
    """Elements of every tensor autograd saves for the backward pass of ``fn(*args, **kwargs)``."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return total


def test_chunked_saves_nothing_of_size_vocabulary_per_row():
    n, h, v = 256, 16, 4096
    hidden, weight, bias, target = problem(n, h, v, torch.float32)
    chunked = saved_elements(token_logprobs_chunked, hidden, weight, target, 0.7, bias, chunk_rows=32)
    reference = saved_elements(token_logprobs_reference, hidden, weight, target, 0.7, bias)
    # hidden + weight + bias + target + lse: O(N*H + V*H), against the reference's [N, V] log-softmax
    assert chunked == n * h + v * h + v + n + n
    assert chunked < n * v / 3
    assert reference >= n * v


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 50])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_entropies_equal_the_reference_float64(chunk_rows, temperature):
    """The entropies of checkpointed chunks, and their gradients, are the reference's (N = 20: short last chunks, one
    chunk larger than N)."""
    hidden, weight, bias, _ = problem(20, 16, 97, torch.float64)
    g = torch.randn(20, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def values_and_grads_of(fn, **kwargs):
        entropy = fn(hidden, weight, temperature, bias, **kwargs)
        return entropy.detach(), torch.autograd.grad((g * entropy).sum(), (hidden, weight, bias))

    ref, ref_grads = values_and_grads_of(token_entropies_reference)
    got, grads = values_and_grads_of(token_entropies, chunk_rows=chunk_rows)
    assert got.dtype == torch.float64 and got.shape == (20,)
    assert max_gap(got, ref) < 1e-12 and all(max_gap(a, b) < 1e-12 for a, b in zip(grads, ref_grads))
    assert bool((ref > 0).all()) and bool((ref < math.log(97)).all())


def test_entropies_by_hand():
    """Logits row 0 = [1, 0, 1]: p = [e, 1, e] / (2e + 1), H = log(2e + 1) - 2e / (2e + 1); row 1 = [0, 2, 2]; and
    dH/dz_k = -p_k (log p_k + H)."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    e = math.e
    want = torch.tensor([math.log(2 * e + 1) - 2 * e / (2 * e + 1),
                         math.log(1 + 2 * e**2) - 4 * e**2 / (1 + 2 * e**2)], dtype=torch.float64)
    for fn in (token_entropies_reference, token_entropies):
        entropy = fn(hidden, weight, 1.0)
        assert max_gap(entropy.detach(), want) < 1e-15
        (grad,) = torch.autograd.grad(entropy[0], hidden)
        p = torch.tensor([e, 1.0, e], dtype=torch.float64) / (2 * e + 1)
        dz = -p * (torch.log(p) + want[0])
        assert max_gap(grad[0], dz @ weight) < 1e-15 and bool((grad[1] == 0).all())


def test_a_token_of_probability_zero_adds_nothing_to_the_entropy_nor_nan_to_its_gradient():
    """A bias of -inf (a token the model can never emit, as a table model's outside its alphabet): the entropy is that
    of the other tokens, and its gradient is finite."""
    hidden = torch.tensor([[1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    bias = torch.tensor([0.0, -math.inf, 0.0], dtype=torch.float64)
    for fn in (token_entropies_reference, token_entropies):
        entropy = fn(hidden, weight, 1.0, bias)
        assert entropy.item() == pytest.approx(math.log(2), abs=1e-15)  # logits 1 and 1: uniform over two tokens
        (grad,) = torch.autograd.grad(entropy.sum(), hidden)
        assert bool(torch.isfinite(grad).all())


def test_chunked_entropies_keep_nothing_of_size_vocabulary_per_row():
    """Each checkpointed chunk keeps its inputs only (the head's weight and bias are the same storage every time):
    O(N*H + V*H) elements, against the reference's [N, V] log-softmax."""
    n, h, v = 256, 16, 4096
    hidden, weight, bias, _ = problem(n, h, v, torch.float32)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_entropies(hidden, weight, 0.7, bias, chunk_rows=32)
    assert sum(storages.values()) == n * h + v * h + v  # hidden's chunks share its storage
    assert saved_elements(token_entropies_reference, hidden, weight, 0.7, bias) >= n * v


def test_default_chunk_rows():
    assert default_chunk_rows(151_936) == 441  # 441 x 151,936 float32 = 256 MiB
    assert default_chunk_rows(2**30) == 1
    hidden, weight, bias, target = problem(5, 4, 7, torch.float64)
    assert max_gap(token_logprobs_chunked(hidden, weight, target, 1.0, bias).detach(),
                   token_logprobs_reference(hidden, weight, target, 1.0, bias).detach()) < 1e-12


def test_input_checks():
    hidden, weight, bias, target = problem(3, 4, 7, torch.float32)
    with pytest.raises(ValueError, match="share a dtype"):
        token_logprobs_chunked(hidden.double(), weight, target, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_chunked(hidden, weight, target, 0.0)
    with pytest.raises(ValueError, match="chunk_rows"):
        token_logprobs_chunked(hidden, weight, target, 1.0, chunk_rows=0)
    with pytest.raises(ValueError, match="shapes"):
        token_logprobs_reference(hidden, weight, target[:2], 1.0)


def test_backend_names():
    assert logprob_backend("reference", "cpu") is token_logprobs_reference
    assert logprob_backend("chunked", "cpu") is token_logprobs_chunked
    assert logprob_backend("auto", "cpu") is token_logprobs_chunked  # liger needs CUDA
    with pytest.raises(ValueError, match="cannot run: .*CUDA"):
        logprob_backend("liger", "cpu")
    with pytest.raises(ValueError, match="unknown log-prob path"):
        logprob_backend("fused", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_chunked_on_cuda():
    """The same bounds as on the CPU: float32 to float32 rounding, bf16 to a few bf16 ulps (cuBLAS's sums)."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2**-6)):
        hidden, weight, bias, target = problem(300, 64, 5000, dtype)
        hidden, weight, bias = (x.detach().cuda().requires_grad_() for x in (hidden, weight, bias))
        target = target.cuda()
        ref, ref_grads = values_and_grads(token_logprobs_reference, hidden, weight, bias, target, 0.7)
        out, grads = values_and_grads(token_logprobs_chunked, hidden, weight, bias, target, 0.7, chunk_rows=37)
        assert max_gap(out, ref) < 1e-5
        for got, want in zip(grads, ref_grads):
            assert max_gap(got, want) <= tol * want.abs().max().item()


_NO_LIGER = liger_unavailable("cuda")


@pytest.mark.skipif(_NO_LIGER is not None, reason=f"liger path not testable here: {_NO_LIGER}")
def test_liger_close_to_reference_on_cuda():
    from seeupo.llm.logprobs import token_logprobs_liger

    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        hidden, weight, bias, target = problem(300, 64, 5000, dtype)
        hidden, weight, bias = (x.detach().cuda().requires_grad_() for x in (hidden, weight, bias))
        target = target.cuda()
        ref, ref_grads = values_and_grads(token_logprobs_reference, hidden, weight, bias, target, 0.7)
        out, grads = values_and_grads(token_logprobs_liger, hidden, weight, bias, target, 0.7)
        assert out.dtype == torch.float32
        assert max_gap(out, ref) < tol
        for got, want in zip(grads, ref_grads):
            assert max_gap(got, want) <= tol * want.abs().max().item()
    assert logprob_backend("auto", "cuda") is token_logprobs_liger


def _tiny_config(name: str, **overrides):
    transformers = pytest.importorskip("transformers")
    sizes = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=8)
    return getattr(transformers, f"{name}Config")(**sizes, **overrides), getattr(transformers, f"{name}ForCausalLM")


@pytest.mark.parametrize("tied", [False, True])
def test_head_of_gives_the_models_own_log_probs(tied):
    config, cls = _tiny_config("Qwen3", tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = cls(config).double()
    assert head_unsupported(model) is None
    weight, bias = head_of(model)
    assert weight is model.get_output_embeddings().weight and bias is None
    assert (weight is model.get_input_embeddings().weight) == tied
    ids = torch.randint(50, (2, 9))
    out = model(input_ids=ids, output_hidden_states=False)
    hidden = model.model(input_ids=ids).last_hidden_state  # after the final norm
    want = torch.log_softmax(out.logits[:, :-1] / 0.7, -1).gather(2, ids[:, 1:, None]).squeeze(2)
    got = token_logprobs_chunked(hidden[:, :-1].reshape(-1, 16), weight, ids[:, 1:].reshape(-1), 0.7, chunk_rows=5)
    assert max_gap(got.detach(), want.detach().reshape(-1)) < 1e-12


def test_head_of_refuses_scaled_or_softcapped_logits():
    config, cls = _tiny_config("Gemma2", final_logit_softcapping=30.0)
    model = cls(config)
    assert head_of(model) is None
    assert "gemma2" in head_unsupported(model)
    config, cls = _tiny_config("Qwen3")
    config.logits_scaling = 8.0  # a Granite-style scale on a known type: refused by the config check
    assert "logits_scaling" in head_unsupported(cls(config))
    assert "no transformers config" in head_unsupported(torch.nn.Linear(3, 4))


def test_liger_version_parsing():
    from seeupo.llm.logprobs import _LIGER_MIN_VERSION, _release

    assert _release("0.8.2") == (0, 8, 2) and _release("0.8.2rc1") == (0, 8, 2)
    assert _release("0.8.5.dev20261027042432") == (0, 8, 5) and _release("1.0") == (1, 0)
    assert _release("0.8.1") < _LIGER_MIN_VERSION <= _release("0.8.2") < _release("0.10.0")


def test_importing_needs_neither_liger_nor_transformers():
    code = ("import sys, seeupo.llm.logprobs; "
            "print(sorted(m for m in ('liger_kernel', 'transformers', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # four subprocesses that import torch: about 10 s
def test_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/logprob_memory.py end to end at a toy size: the record is appended and the paths agree."""
    out = tmp_path / "lpm.jsonl"
    out.write_text(json.dumps({"an": "earlier record"}) + "\n")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "logprob_memory.py"
    subprocess.run([sys.executable, str(script), "--device", "cpu", "--rows", "50", "--hidden", "8", "--vocab", "300",
                    "--out", str(out)], check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and records[0] == {"an": "earlier record"}
    record = records[-1]
    assert {(r["path"], r["pass"]) for r in record["results"]} == {
        (p, k) for p in ("reference", "chunked") for k in ("score", "update")}
    assert max(record["logp_mean_gap"].values()) < 1e-6
    assert set(record["ratio_reference_over_chunked"]) >= {"score", "update"}
