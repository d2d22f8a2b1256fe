"""benchmarks/multiturn_cost.py: the BFCL-shaped batch and the exact token counts per pass type."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from seeupo.core.config import preset  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "multiturn_cost.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("multiturn_cost", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def small_batch(bench, tokenizer):
    """2 tasks x 2 rollouts x 3 turns; context 7, response 3, observation 2; rollout 0 of each task ends early."""
    low = len(tokenizer.all_special_ids) + 3
    return bench.bfcl_batch(len(tokenizer), low, tasks=2, group=2, turns=3, context=7, response=3, observation=2,
                            early_end=0.5, seed=1)


def test_batch_is_built_as_the_agent_loop_builds_it(bench, tiny32):
    _, tokenizer = tiny32
    batch, taken = small_batch(bench, tokenizer)
    assert batch.num_rows == 12 and taken[1] == taken[3] == 3 and 1 <= taken[0] <= 2 and 1 <= taken[2] <= 2
    ids, mask, start = batch.data["input_ids"], batch.data["attention_mask"], batch.data["response_start"]
    for k in range(4):
        for t in range(3):
            i = k * 3 + t
            if t >= taken[k]:  # a placeholder: no tokens
                assert not batch.valid[i] and int(mask[i].sum()) == 0
                continue
            # turn t: context 7 + t * (3 + 2), then the 3-token response
            assert int(start[i]) == 7 + 5 * t and int(mask[i].sum()) == 10 + 5 * t
            if t > 0:  # the previous row is a prefix of this one
                assert torch.equal(ids[i - 1, : 5 + 5 * t], ids[i, : 5 + 5 * t])
    # the rollouts of a task share its prompt; the tasks' prompts differ
    assert torch.equal(ids[0, :7], ids[3, :7]) and not torch.equal(ids[0, :7], ids[6, :7])
    assert bench.row_lengths(taken, 3, 7, 3, 2)[1] == [10, 15, 20]


def test_per_row_counts_equal_the_arithmetic_sum_for_each_pass_type(bench, tiny32):
    model, tokenizer = tiny32
    batch, taken = small_batch(bench, tokenizer)
    by_turn = [10, 15, 20]
    total = sum(sum(by_turn[:k]) for k in taken)  # every valid row's context + response
    turn0 = 4 * 10
    expected = {
        # one optimizer step (on-policy): the update's own passes score logp_old
        "grpo": {"reference": total, "update": total},
        # the reverse sweep ends with turn 0, whose ratio pass is not made; fused, each turn's ratio
        # pass is part of the next turn's first optimizer step
        "seeupo": {"logp_old": total, "reference": total, "update": total + total - turn0},
        "seeupo-unfused": {"logp_old": total, "reference": total, "update": total, "m_ratio": total - turn0},
        "ppo": {"reference": total, "critic_values": total, "update": total, "critic_update": total},
    }
    for name, want in expected.items():
        cfg = preset(name.removesuffix("-unfused"), group_size=2, kl_coef=0.002, epochs=1, minibatches=1)
        fuse = not name.endswith("-unfused")
        got = bench.measure_step(model, batch, cfg, "per_row", timed=False, fuse=fuse)
        assert got["tokens"] == want, name
        assert bench.per_row_expectation(bench.row_lengths(taken, 3, 7, 3, 2), cfg, fuse) == want | {
            k: 0 for k in bench.PASS_TYPES if k not in want}
        assert all(got["padded"][k] >= got["tokens"][k] for k in want)
    # two epochs forward every row twice in the update, after a scoring pass of logp_old
    cfg = preset("grpo", group_size=2, kl_coef=0.002, epochs=2, minibatches=2)
    tokens = bench.measure_step(model, batch, cfg, "per_row", timed=False)["tokens"]
    assert (tokens["update"], tokens["logp_old"]) == (2 * total, total)
    assert bench.measure_step(model, batch, preset("grpo", group_size=2), "per_row", timed=False,
                              rescore=True)["tokens"]["logp_old"] == total


def test_count_only_model_counts_the_same_tokens(bench, tiny32):
    model, tokenizer = tiny32
    batch, _ = small_batch(bench, tokenizer)
    cfg = preset("seeupo", group_size=2, kl_coef=0.002)
    full = bench.measure_step(model, batch, cfg, "per_row", timed=False)
    zero = bench.measure_step(bench.zero_layer_copy(model), batch, cfg, "per_row", timed=False)
    assert len(bench.zero_layer_copy(model).base_model.layers) == 0
    assert (zero["tokens"], zero["calls"]) == (full["tokens"], full["calls"])


def test_cli_rejects_unknown_presets_with_exit_2(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--presets", "grpo,nope", "--no-record"])
    assert exc.value.code == 2 and "--presets" in capsys.readouterr().err


def test_a_real_shape_counts_like_any_model(bench):
    # --shape builds a random Qwen3 of a released configuration (here the tiny one); --count-only drops its layers
    args = bench.argparse.Namespace(shape="tiny", model=None, dtype="float32", count_only=True, device="cpu", tasks=1,
                                    group=2, turns=3, context=7, response=3, observation=2, early_end=0.0, seed=0)
    model, batch, lengths = bench._setup(args)
    assert model.config.vocab_size == 512 and len(model.base_model.layers) == 0
    assert int(batch.data["input_ids"].max()) < 512 and lengths[0] == [10, 15, 20]
    cfg = preset("grpo", group_size=2, kl_coef=0.002)
    got = bench.measure_step(model, batch, cfg, "per_row", timed=False)
    assert got["tokens"]["reference"] == 2 * (10 + 15 + 20)


def test_cli_rejects_an_unknown_shape_with_exit_2(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--shape", "qwen9", "--no-record"])
    assert exc.value.code == 2 and "--shape" in capsys.readouterr().err


def test_gpu_step_arms_name_levers_and_a_memory_share():
    spec = importlib.util.spec_from_file_location("gpu_step", SCRIPT.parent / "gpu_step.py")
    gpu_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_step)
    assert gpu_step.parse_arm("default") == (set(), None)
    assert gpu_step.parse_arm("as_needed+share=0.5+segments") == ({"as_needed", "segments"}, 0.5)
    assert gpu_step.parse_arm("flex=rows_safe+recompute_attention") == ({"flex=rows_safe", "recompute_attention"}, None)
    for bad in ("share=0", "share=1.5", "share=half", "as_needed+fast", "flex=fastest", "segments+cascade"):
        with pytest.raises(ValueError):
            gpu_step.parse_arm(bad)
