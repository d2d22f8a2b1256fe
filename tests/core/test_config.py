"""AlgorithmConfig validation and the presets (seeupo.core.config)."""

from __future__ import annotations

import dataclasses

import pytest

from seeupo.core.config import PRESETS, AlgorithmConfig, preset

EXPECTED_PRESETS = {"ppo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "rloo", "seeupo"}


def test_preset_names():
    assert set(PRESETS) == EXPECTED_PRESETS


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_every_preset_constructs(name):
    cfg = preset(name)
    assert isinstance(cfg, AlgorithmConfig)
    assert cfg.name == name
    assert cfg == PRESETS[name]
    # a round trip through to_dict re-runs validation and gives the same config
    assert AlgorithmConfig(**cfg.to_dict()) == cfg


def test_preset_contents_match_table_1():
    ppo, grpo, rpp, gspo, rloo, seeupo = (PRESETS[k] for k in ("ppo", "grpo", "reinforce_pp", "gspo", "rloo", "seeupo"))
    assert (ppo.advantage, ppo.update, ppo.ratio_level, ppo.schedule) == ("gae", "ppo", "token", "simultaneous")
    assert (grpo.advantage, grpo.grae_scale, grpo.update, grpo.ratio_level) == ("grae", "group_std", "ppo", "token")
    assert (rpp.advantage, rpp.update, rpp.ratio_level) == ("reinforce_pp", "ppo", "token")  # its return-to-go
    rpp_baseline = PRESETS["reinforce_pp_baseline"]  # Table 1's reading of REINFORCE++: GRAE + batch z-score
    assert (rpp_baseline.advantage, rpp_baseline.grae_scale, rpp_baseline.update) == ("grae", "batch_std", "ppo")
    assert (gspo.ratio_level, gspo.ratio_scope, gspo.length_norm, gspo.update) == ("sequence", "trajectory", True, "ppo")
    assert (rloo.grae_center, rloo.update) == ("loo", "reinforce")
    # SeeUPO (docs/method.md §4): mean-centred GRAE + batch z-score (not the group std), per-turn length-normalised
    # sequence ratio, sequential reverse order, HAPPO weight
    assert (seeupo.advantage, seeupo.grae_center, seeupo.grae_scale) == ("grae", "mean", "batch_std")
    assert (seeupo.update, seeupo.ratio_level, seeupo.ratio_scope, seeupo.length_norm) == ("ppo", "sequence", "turn", True)
    assert (seeupo.schedule, seeupo.order, seeupo.m_factor) == ("sequential", "reverse", "happo")
    for cfg in PRESETS.values():  # GSPO's own range (its paper, §5.1); every other preset the common 0.2
        assert (cfg.clip_eps_low, cfg.clip_eps_high) == ((3e-4, 4e-4) if cfg.name == "gspo" else (0.2, 0.2))
        assert cfg.schedule == ("sequential" if cfg.name == "seeupo" else "simultaneous")


def test_preset_overrides():
    cfg = preset("seeupo", order="forward", epochs=4, minibatches=2, kl_coef=0.002)
    assert (cfg.order, cfg.epochs, cfg.minibatches, cfg.kl_coef) == ("forward", 4, 2, 0.002)
    base = PRESETS["seeupo"]
    for f in dataclasses.fields(AlgorithmConfig):
        if f.name not in ("order", "epochs", "minibatches", "kl_coef", "name"):
            assert getattr(cfg, f.name) == getattr(base, f.name), f.name
    assert cfg.name == "seeupo+order=forward"  # order is an identity field; epochs, minibatches, kl_coef are not
    # the registry is not mutated
    assert PRESETS["seeupo"].order == "reverse" and PRESETS["seeupo"].epochs == 1
    # custom order through an override
    cfg = preset("seeupo", order="custom", custom_order=(1, 0, 2))
    assert cfg.custom_order == (1, 0, 2)
    assert cfg.name == "seeupo+order=custom,custom_order=1-0-2"


def test_a_modified_preset_is_never_labelled_as_the_preset():
    # issue 16: GRPO with other advantage and aggregation settings was saved as "grpo"
    cfg = preset("grpo", grae_scale="none", aggregation="seq_mean_token_sum")
    assert cfg.name == "grpo+grae_scale=none,aggregation=seq_mean_token_sum"
    assert cfg.preset == "grpo"
    # a named variant: preset("grpo", name=...) used to raise TypeError (two values for `name`)
    dr = preset("grpo", name="drgrpo", grae_scale="none", aggregation="seq_mean_token_sum")
    assert (dr.name, dr.preset, dr.grae_scale, dr.aggregation) == ("drgrpo", "grpo", "none", "seq_mean_token_sum")
    # hyperparameters keep the name; so does an identity field set to the preset's own value
    assert preset("grpo", group_size=16, kl_coef=0.01, epochs=3).name == "grpo"
    # a field only the sequential schedule reads changes nothing under the simultaneous one
    assert preset("grpo", equal_budget=True, order="forward", m_refresh=True).name == "grpo"
    assert preset("grpo", schedule="sequential", equal_budget=True).name == "grpo+schedule=sequential,equal_budget=true"
    assert preset("seeupo", equal_budget=True).name == "seeupo+equal_budget=true"
    assert preset("grpo", grae_scale="group_std").name == "grpo"
    # a preset's name for another algorithm is refused, naming what differs
    with pytest.raises(ValueError, match="'grpo' is the name of a preset whose .*grae_scale"):
        preset("grpo", name="grpo", grae_scale="none")
    with pytest.raises(ValueError, match="name of a preset"):
        preset("ppo", name="seeupo")
    assert preset("grpo", name="grpo", epochs=2).name == "grpo"
    with pytest.raises(ValueError, match="non-empty"):
        preset("grpo", name=" ")


def test_identity_fields_are_fields_and_include_every_field_that_separates_presets():
    from seeupo.core.config import IDENTITY_FIELDS

    names = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    assert set(IDENTITY_FIELDS) <= names
    hyperparameters = {"name", "preset", "clip_eps_low", "clip_eps_high"}  # GSPO's published clip is its own
    separating = {f for f in names - hyperparameters if len({repr(getattr(p, f)) for p in PRESETS.values()}) > 1}
    assert separating <= set(IDENTITY_FIELDS)
    # every preset differs from every other in an identity field, so no preset can carry another's name
    for a in PRESETS.values():
        for b in PRESETS.values():
            if a is not b:
                assert any(getattr(a, f) != getattr(b, f) for f in IDENTITY_FIELDS), (a.name, b.name)


def test_preset_override_is_validated():
    with pytest.raises(ValueError, match="order"):
        preset("seeupo", order="sideways")
    with pytest.raises(ValueError, match="epochs"):
        preset("grpo", epochs=0)


def test_unknown_preset_raises():
    with pytest.raises(ValueError, match="nope"):
        preset("nope")


def test_config_is_frozen():
    cfg = preset("ppo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3  # type: ignore[misc]


def test_replace_returns_new_validated_config():
    cfg = AlgorithmConfig()
    new = cfg.replace(update="reinforce")
    assert new.update == "reinforce" and cfg.update == "ppo"
    with pytest.raises(ValueError, match="update"):
        cfg.replace(update="trpo")


CHOICE_FIELDS = [
    "advantage", "grae_center", "grae_scale", "update", "ratio_level", "ratio_scope",
    "kl_estimator", "aggregation", "schedule", "order", "m_factor", "m_alignment",
]


@pytest.mark.parametrize("field", CHOICE_FIELDS)
def test_bad_choice_raises_with_field_name(field):
    with pytest.raises(ValueError, match=field):
        AlgorithmConfig(**{field: "bogus"})


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(group_size=1), "group_size"),
        (dict(group_size=0), "group_size"),
        (dict(epochs=0), "epochs"),
        (dict(minibatches=0), "minibatches"),
        (dict(epochs=-1), "epochs"),
        (dict(order="custom"), "custom_order"),
        (dict(clip_eps_low=1.0), "clip_eps_low"),
        (dict(clip_eps_low=-0.1), "clip_eps_low"),
        (dict(clip_eps_high=-0.1), "clip_eps_high"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else None,
)
def test_bad_value_raises_with_field_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AlgorithmConfig(**kwargs)


def test_group_size_only_matters_for_grae():
    assert AlgorithmConfig(advantage="gae", group_size=1).group_size == 1
    assert AlgorithmConfig(advantage="oracle", group_size=1).group_size == 1


def test_valid_edge_values_accepted():
    AlgorithmConfig(clip_eps_low=0.0, clip_eps_high=0.0)
    AlgorithmConfig(clip_eps_low=0.99, clip_eps_high=5.0)
    AlgorithmConfig(order="custom", custom_order=(0,))
    AlgorithmConfig(dual_clip=3.0, kl_coef=0.0, grae_clamp=5.0, m_clip=(0.5, 2.0), gae_gamma=0.0, gae_lambda=0.0)
    AlgorithmConfig(correction_floor=1.0, correction_cap=1.0, m2_tau=0.0)
    AlgorithmConfig(correction="sequence_is", correction_cap=float("inf"))  # uncapped: the unbiased weight


# Values that are invalid on their face but that AlgorithmConfig currently accepts (reported as suspected
# bugs): each would only fail later (dual_clip in the first loss call) or silently compute nonsense
# (torch.clamp with min > max returns max everywhere; a negative KL coefficient rewards divergence).
@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(dual_clip=1.0), "dual_clip"),
        (dict(dual_clip=0.5), "dual_clip"),
        (dict(m_clip=(1.2, 0.8)), "m_clip"),
        (dict(kl_coef=-0.1), "kl_coef"),
        (dict(gae_gamma=1.5), "gae_gamma"),
        (dict(gae_lambda=-0.1), "gae_lambda"),
        (dict(grae_clamp=-1.0), "grae_clamp"),
        (dict(order="custom", custom_order=(0, 0, 1)), "custom_order"),
        (dict(correction_floor=0.0), "correction_floor"),  # a mask's log(floor) would be -inf
        (dict(correction_floor=1.5), "correction_floor"),
        (dict(correction_cap=0.9), "correction_cap"),
        (dict(m2_tau=-0.01), "m2_tau"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else None,
)
def test_unvalidated_bad_value_raises_with_field_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AlgorithmConfig(**kwargs)


def test_register_preset_names_an_algorithm_for_every_command():
    from seeupo.core.config import PRESETS, preset, register_preset
    from seeupo.core.registry import NameClash

    try:
        cfg = register_preset(preset("grpo", name="preset_test", grae_scale="none"))
        assert PRESETS["preset_test"] is cfg and cfg.preset == "preset_test" and cfg.grae_scale == "none"
        # a preset derived from it keeps its name for hyperparameters and renames for identity fields
        assert preset("preset_test", group_size=8).name == "preset_test"
        assert preset("preset_test", grae_scale="group_std").name == "preset_test+grae_scale=group_std"
        with pytest.raises(NameClash, match="'preset_test' is already registered"):
            register_preset(preset("seeupo").replace(name="preset_test"))
        with pytest.raises(NameClash, match="'grpo' is already registered"):
            register_preset(preset("seeupo").replace(name="grpo"))
        with pytest.raises(ValueError, match="needs a name of its own"):
            register_preset(preset("seeupo").replace(name="custom"))
    finally:
        PRESETS.pop("preset_test", None)
