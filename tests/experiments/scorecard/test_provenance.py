"""Every catalogue algorithm's definition table: each aspect once, each with its source, each departure with its
reason; docs/algorithms.md is the table; the three definitions the field got wrong before are the authors' now."""

from pathlib import Path

from seeupo.experiments.scorecard.catalogue import CATALOGUE
from seeupo.experiments.scorecard.provenance import ASPECTS, DEFINITIONS, algorithms_markdown, definition, departures

ROOT = Path(__file__).resolve().parents[3]
CORE = [a for a in ASPECTS if a != "other"]


def test_every_catalogue_algorithm_has_every_aspect_once_with_a_source():
    assert set(DEFINITIONS) == {e.name for e in CATALOGUE}
    for name, settings in DEFINITIONS.items():
        aspects = [s.aspect for s in settings]
        assert [a for a in aspects if a != "other"] == CORE, name  # in order, each once
        for s in settings:
            assert s.published and s.source and s.toolkit, (name, s.aspect)
            assert s.departs is None or len(s.departs) > 10, (name, s.aspect)


def test_the_page_is_the_tables():
    assert (ROOT / "docs" / "algorithms.md").read_text() == algorithms_markdown()


def test_the_definitions_fixed_in_this_pass_match_their_sources():
    from seeupo import plugins
    from seeupo.core.config import PRESETS

    clip = next(s for s in definition("gspo") if s.aspect == "clip")
    assert "3e-4 / 4e-4" in clip.published and "§5.1" in clip.source and clip.departs is None
    assert (PRESETS["gspo"].clip_eps_low, PRESETS["gspo"].clip_eps_high) == (3e-4, 4e-4)
    advantage = next(s for s in definition("gigpo") if s.aspect == "advantage")
    assert 'mode="mean_norm"' in advantage.source and advantage.departs is None
    assert "_assign_advantages" in next(s for s in definition("mt_grpo") if s.aspect == "advantage").source
    assert PRESETS["reinforce_pp"].advantage == "reinforce_pp" and PRESETS["reinforce_pp_baseline"].advantage == "grae"
    plugins.forget_plugins()
    try:
        plugins.load_plugin(str(ROOT / "examples" / "algorithms" / "gigpo.py"))
        assert {"gigpo", "gigpo_std"} <= set(PRESETS)
    finally:
        plugins.forget_plugins()
    assert {s.aspect for s in departures("seeupo")} == {"epochs and minibatches", "other"}


def test_each_card_s_kl_term_is_the_one_its_definition_table_names():
    """The catalogue's published KL settings (which the cards run) and the KL row of each definition table agree:
    the estimator, whether it sits in the reward, and the coefficient."""
    from seeupo.experiments.scorecard.catalogue import CATALOGUE

    for e in CATALOGUE:
        row = next(s for s in definition(e.name) if s.aspect == "KL")
        settings = dict(e.published)
        if not settings:
            assert row.toolkit.startswith("none"), e.name
            continue
        coef = {0.04: "0.04", 0.05: "0.05", 0.01: "0.01", 1e-5: "1e-5", 0.002: "0.002"}[settings["kl_coef"]]
        assert row.toolkit.startswith(settings["kl_estimator"]) and coef in row.toolkit, (e.name, row.toolkit)
        assert ("in the reward" in row.toolkit) == (settings["kl_placement"] == "reward"), e.name
