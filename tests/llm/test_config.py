"""The train config: paper defaults, presets plus overrides, YAML quirks, one-line errors naming the key."""

import pytest

from seeupo.core.config import PRESETS
from seeupo.llm.config import PAPER_ALGORITHM, TrainConfig, load_train_config
from seeupo.validation.errors import InputError


def test_defaults_are_the_papers_settings():
    cfg = load_train_config(None)
    assert cfg.algorithm == PRESETS["seeupo"].replace(**PAPER_ALGORITHM)
    assert (cfg.algorithm.group_size, cfg.algorithm.kl_coef, cfg.algorithm.kl_estimator) == (8, 0.002, "k3")
    assert (cfg.algorithm.clip_eps_low, cfg.algorithm.clip_eps_high) == (0.2, 0.2)
    assert (cfg.optim.lr, cfg.rollout.temperature, cfg.rollout.max_turns, cfg.rollout.tasks_per_step) == (1e-6, 0.9, 10, 32)


def test_yaml_file_with_overrides_and_round_trip(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  preset: gspo\n  epochs: 2\noptim:\n  lr: 1e-5\nenv:\n  name: bridge\n  options: {turns: 3}\nsteps: 4\n")
    cfg = load_train_config(path, ["optim.warmup_steps=2", "algorithm.minibatches=4", "env.options.kind=tree_mdp"])
    assert cfg.algorithm == PRESETS["gspo"].replace(**PAPER_ALGORITHM, epochs=2, minibatches=4)
    assert cfg.optim.lr == 1e-5 and cfg.optim.warmup_steps == 2 and cfg.steps == 4  # 1e-5 is a float, not a string
    assert cfg.env.options == {"turns": 3, "kind": "tree_mdp"}
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("overrides,message", [
    (["optim.lrr=1"], "field 'config.optim.lrr': unknown field; expected ['beta1'"),
    (["algorithm.preset=nope"], "unknown preset 'nope'; expected one of ['grpo'"),
    (["algorithm.order=sideways"], "field 'config.algorithm.order': unknown value 'sideways'"),
    (["steps=true"], "field 'config.steps': must be an integer, got a boolean"),
    (["steps=0"], "field 'config.steps': must be in [1,"),
    (["rollout.temperature=hot"], "field 'config.rollout.temperature': must be a finite number, got a string"),
    (["optim=3"], "field 'config.optim': must be an object"),
    (["novalue"], "argument --set: expected KEY=VALUE"),
    (["rollout.vllm_sleep=true"], "field 'config.rollout.vllm_sleep': needs rollout.engine: vllm"),
    (["rollout.engine=sglang"], "field 'config.rollout.engine': unknown value 'sglang'"),
    (["out_dir=' '"], "field 'config.out_dir': must be a folder path, got ' '"),  # not the current folder
    (["parallel.mixed_precision=fp8"], "field 'config.parallel.mixed_precision': unknown value 'fp8'"),
    (["optim.micro_batch_tokens=0"], "field 'config.optim.micro_batch_tokens': must be in [1,"),
    (["optim.scoring=tree"], "field 'config.optim.scoring': unknown value 'tree'"),
    (["algorithm.entropy_coef=-0.01"], "field 'config.algorithm.entropy_coef': must be in [0,"),
    (["algorithm.correction=tis"], "field 'config.algorithm.correction'"),
    (["algorithm.kl_placement=prior"], "field 'config.algorithm.kl_placement': unknown value 'prior'"),
])
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(InputError) as err:
        load_train_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,message", [
    ("steps: [1\n", "not valid YAML"),
    ("a: &x 1\nb: *x\n", "anchors and aliases"),
    ("- 1\n- 2\n", "must be a mapping of sections"),
    ("modle: {}\n", "field 'config.modle': unknown field"),
    ("", "has no sections"),
    ("# only a comment\n", "has no sections"),
])
def test_bad_files_name_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_train_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_bad_value_from_set_names_the_flag_not_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout: {temperature: 0.9}\nsteps: 3\n")
    with pytest.raises(InputError) as err:
        load_train_config(path, ["steps=4", "rollout.temperature=abc"])
    assert str(err.value).startswith("--set rollout.temperature=abc: field 'config.rollout.temperature'")
    assert str(path) not in str(err.value)
    with pytest.raises(InputError) as err:  # a whole section given by --set
        load_train_config(path, ["rollout={temperature: abc}"])
    assert str(err.value).startswith("--set rollout={temperature: abc}: ")
    path.write_text("rollout: {temperature: abc}\n")  # the file's own value stays the file's fault
    with pytest.raises(InputError) as err:
        load_train_config(path, ["steps=4"])
    assert str(err.value).startswith(f"{path}: field 'config.rollout.temperature'")


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        load_train_config("does/not/exist.yaml")


# ---------------------------------------------------------------- issue 16: checks before the model loads

from pathlib import Path  # noqa: E402

from seeupo.llm.config import (  # noqa: E402
    LIMITS, RESUMABLE_FIELDS, check_for_training, flat_config, resume_changes,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides,key,message", [
    (["rollout.max_turns=1"], "config.rollout.max_turns", "below the bridge problem's 2 turns"),
    (["rollout.max_turns=3", "env.options.turns=4"], "config.rollout.max_turns", "below the bridge problem's 4 turns"),
    (["optim.micro_batch_tokens=1"], "config.optim.micro_batch_tokens", "smaller than the longest possible row"),
    (["optim.micro_batch_tokens=8191"], "config.optim.micro_batch_tokens", "rollout.max_context = 8192"),
    (["env.name=bfcl", "env.options={categories: [multi_turn_nope]}"], "config.env.options", "unknown category 'multi_turn_nope'"),
    (["env.name=bfcl", "env.options={split: random}"], "config.env.options.split", "unknown value 'random'"),
    (["env.name=atari"], "config.env.name", "unknown environment 'atari'"),
    (["algorithm.advantage=oracle"], "config.algorithm.advantage", "no language-model form"),
    (["env.name=bfcl", "env.options={max_steps: 10}", "rollout.max_turns=9"], "config.rollout.max_turns",
     "below env.options.max_steps = 10"),
    (["env.options.turns=7"], "config.env.options.turns", "must be in [1, 6]"),
    (["algorithm.group_size=10000000"], "config.algorithm.group_size", "must be in [1, 1000000]"),
    (["algorithm.epochs=100000"], "config.algorithm.epochs", "must be in [1, 1000]"),
    (["algorithm.name=[1]"], "config.algorithm.name", "non-empty string"),
    (["algorithm.preset=grpo", "algorithm.name=seeupo"], "config.algorithm.name", "name of a preset"),
])
def test_cross_field_and_environment_errors_come_from_the_config(overrides, key, message):
    with pytest.raises(InputError) as err:
        load_train_config(None, overrides)
    assert err.value.field == key and message in str(err.value) and "\n" not in str(err.value)


def test_consistent_settings_pass():
    cfg = load_train_config(None, ["rollout.max_turns=2", "optim.micro_batch_tokens=8192", "env.options.turns=2"])
    assert cfg.optim.micro_batch_tokens == 8192
    cfg = load_train_config(None, ["env.name=bfcl", "env.options={max_steps: 4}", "rollout.max_turns=4"])
    assert cfg.rollout.max_turns == 4
    assert load_train_config(None, ["rollout.max_context=512", "optim.micro_batch_tokens=512"]).optim.micro_batch_tokens == 512


@pytest.mark.parametrize("overrides,key,message", [
    (["rollout.top_p=0.7"], "config.rollout.top_p", "full softmax, while the sampler would draw from the truncated one"),
    # 32 tasks x 10**6 rollouts: the run of issue 16 that hung for minutes
    (["algorithm.group_size=1000000"], "config.algorithm.group_size", "32 x 1000000 = 32000000 episodes per step"),
    (["rollout.tasks_per_step=5000", "algorithm.group_size=2"], "config.rollout.tasks_per_step", "10000 episodes per step"),
    # 32 x 8 episodes x 10 turns x 2**20 tokens = 2.7e9 positions > 2**28
    (["rollout.max_context=1048576"], "config.rollout.max_context", "2.68e+09 token positions per step"),
    # 4 actions x 4 observations over 6 turns: sum_t 16**t, about 1.8e7 table entries, far more than 10**5
    (["env.options={kind: tree_mdp, turns: 6, actions: 4, observations: 4}", "rollout.max_turns=6"], "config.env.options",
     "table entries"),
])
def test_training_limits_and_top_p(overrides, key, message):
    cfg = load_train_config(None, overrides)
    with pytest.raises(InputError) as err:
        check_for_training(cfg)
    assert err.value.field == key and message in str(err.value) and "\n" not in str(err.value)
    if key != "config.rollout.top_p":
        assert "limits.allow_large: true" in str(err.value)
        check_for_training(load_train_config(None, overrides + ["limits.allow_large=true"]))  # the documented way past


def test_the_limits_are_what_the_sizes_add_up_to():
    # at the limit exactly: 4096 episodes x 1 turn x 65536 tokens = 2**28 positions, accepted
    cfg = load_train_config(None, ["rollout.tasks_per_step=512", "algorithm.group_size=8", "rollout.max_turns=2",
                                   "rollout.max_context=32768"])
    assert 512 * 8 == LIMITS["episodes_per_step"] and 4096 * 2 * 32768 == LIMITS["batch_token_positions"]
    check_for_training(cfg)
    with pytest.raises(InputError, match="episodes per step"):
        check_for_training(load_train_config(None, ["rollout.tasks_per_step=513", "algorithm.group_size=8"]))
    with pytest.raises(InputError, match="token positions"):
        check_for_training(load_train_config(None, ["rollout.tasks_per_step=512", "algorithm.group_size=8",
                                                    "rollout.max_turns=2", "rollout.max_context=32769"]))


# configs/verl/ holds verl's Hydra configs, checked by tests/integrations/test_verl_worker.py
@pytest.mark.parametrize("path", sorted(p for p in (REPO / "configs").rglob("*.yaml") if p.parent.name != "verl"),
                         ids=lambda p: p.name)
def test_every_shipped_config_trains_within_the_limits_at_top_p_1(path):
    cfg = load_train_config(path)
    assert cfg.rollout.top_p == 1.0
    check_for_training(cfg)


def test_every_builtin_environment_registers_its_options_class():
    from seeupo.llm.envs import ENVIRONMENTS

    assert ENVIRONMENTS.names() == ("bridge", "bfcl", "appworld")
    for name in ENVIRONMENTS.names():
        entry = ENVIRONMENTS.get(name)
        assert entry.builtin and entry.options is not None and entry.options.__module__ == f"seeupo.llm.envs.{name}"


def test_resumable_fields_are_config_keys():
    keys = set(flat_config(TrainConfig().to_dict()))
    assert set(RESUMABLE_FIELDS) <= keys


def test_scoring_layout_is_a_resumable_setting():
    assert TrainConfig().optim.scoring == "prefix_shared"
    saved = load_train_config(None, ["steps=4"]).to_dict()
    assert resume_changes(saved, load_train_config(None, ["steps=4", "optim.scoring=per_row"])) == {
        "optim.scoring": ("prefix_shared", "per_row")}


def test_resume_changes_allow_only_the_resumable_fields():
    saved = load_train_config(None, ["steps=4", "env.options.turns=2"]).to_dict()
    longer = load_train_config(None, ["steps=9", "checkpoint.every=3", "logging.progress=false"])
    assert resume_changes(saved, longer) == {"checkpoint.every": (10, 3), "logging.progress": (True, False), "steps": (4, 9)}
    # an option left out equals its default written out; the same config has no changes
    assert resume_changes(saved, load_train_config(None, ["steps=4"])) == {}
    with pytest.raises(InputError) as err:
        resume_changes(saved, load_train_config(None, ["steps=9", "algorithm.preset=grpo", "model.dtype=float64",
                                                       "env.options.problem_seed=3"]))
    text = str(err.value)
    assert "\n" not in text and "steps" not in text.split(" (only")[0]
    assert "algorithm.name" not in text.split(" (only")[0]  # a label; the fields below are what changed
    for change in ("algorithm.preset: 'seeupo' -> 'grpo'",
                   "algorithm.grae_scale: 'batch_std' -> 'group_std'", "model.dtype: 'float32' -> 'float64'",
                   "env.options.problem_seed: 0 -> 3"):
        assert change in text, change


def test_a_saved_config_without_newer_sections_compares_with_their_defaults():
    saved = load_train_config(None, ["steps=4"]).to_dict()
    del saved["limits"]  # a run saved before the section existed
    assert resume_changes(saved, load_train_config(None, ["steps=4"])) == {}
    # a run of a modified preset saved under the preset's name resumes under the name that says what it is
    cfg = load_train_config(None, ["steps=4", "algorithm.equal_budget=true"])
    old = cfg.to_dict()
    old["algorithm"]["name"] = "seeupo"
    assert resume_changes(old, cfg) == {"algorithm.name": ("seeupo", "seeupo+equal_budget=true")}


def test_the_saved_algorithm_says_what_ran_and_reads_back():
    cfg = load_train_config(None, ["algorithm.preset=grpo", "algorithm.aggregation=seq_mean_token_sum", "algorithm.grae_scale=none"])
    saved = cfg.to_dict()["algorithm"]
    assert (saved["preset"], saved["name"]) == ("grpo", "grpo+grae_scale=none,aggregation=seq_mean_token_sum")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    named = load_train_config(None, ["algorithm.preset=grpo", "algorithm.name=drgrpo", "algorithm.grae_scale=none"])
    assert (named.algorithm.name, named.algorithm.preset) == ("drgrpo", "grpo")
    assert TrainConfig.from_dict(named.to_dict()) == named
    # the paper's settings and other hyperparameters are not a modification
    assert load_train_config(None, ["algorithm.preset=grpo", "algorithm.group_size=4"]).algorithm.name == "grpo"


def test_a_registered_preset_keeps_its_own_settings_the_paper_ones_apply_to_built_ins():
    from seeupo.core.config import preset, register_preset

    register_preset(preset("grpo", name="clip_higher_test", clip_eps_high=0.28, kl_coef=0.0, group_size=6))
    try:
        cfg = load_train_config(None, ["algorithm.preset=clip_higher_test"]).algorithm
        assert (cfg.name, cfg.clip_eps_high, cfg.kl_coef, cfg.group_size) == ("clip_higher_test", 0.28, 0.0, 6)
        cfg = load_train_config(None, ["algorithm.preset=clip_higher_test", "algorithm.kl_coef=0.01"]).algorithm
        assert (cfg.name, cfg.clip_eps_high, cfg.kl_coef) == ("clip_higher_test", 0.28, 0.01)
        builtin = load_train_config(None, ["algorithm.preset=grpo"]).algorithm
        assert (builtin.clip_eps_high, builtin.kl_coef, builtin.group_size) == (0.2, 0.002, 8)
    finally:
        PRESETS.pop("clip_higher_test")


def test_activation_checkpointing_as_needed_is_on_where_auto_is():
    for value in ("auto", "as_needed"):
        par = load_train_config(None, [f"parallel.activation_checkpointing={value}", "out_dir=unused"]).parallel
        assert (par.checkpointing_on("cpu"), par.checkpointing_on("cuda:0")) == (False, True)
    with pytest.raises(InputError, match="'auto' or 'as_needed', got 'sometimes'"):
        load_train_config(None, ["parallel.activation_checkpointing=sometimes", "out_dir=unused"])


def test_memory_share_is_a_share_of_the_device():
    assert load_train_config(None, ["out_dir=unused"]).parallel.memory_share == 0.85
    assert load_train_config(None, ["parallel.memory_share=0.5", "out_dir=unused"]).parallel.memory_share == 0.5
    for bad in ("0", "1.5"):
        with pytest.raises(InputError, match="memory_share"):
            load_train_config(None, [f"parallel.memory_share={bad}", "out_dir=unused"])
