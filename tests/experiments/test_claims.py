"""The claims registry: every claim is well formed, and its check returns a verdict in the shared vocabulary.

The verdicts themselves are measurements (``seeupo claims``), not asserted here, with a few
exceptions: a lemma the toolkit proves symbolically must come out ``proved``, and the Table 1
claims must agree with ``seeupo verify``'s Table 1, cell by cell (the same story in both reports).
"""

from __future__ import annotations

import json

import pytest

from seeupo.experiments.claims import CLAIMS, QUICK, Budget, Job, check_all, job, markdown, measure_search
from seeupo.experiments.verdicts import AGREEMENT, MEASURED, TABLE1_CLAIMS, Verdict, check, label

FAST = ["L-surrogate", "L-grae-mean", "L-affine", "L-backward", "D"]
PROVED = ["L-surrogate", "L-grae-mean", "L-affine", "L-backward"]  # sympy / exact constructions
ENTRY_KEYS = {"id", "statement", "assumptions", "source", "measured", "agreement", "condition", "status", "summary",
              "evidence", "seconds"}


def check_entry(entry: dict) -> None:
    assert set(entry) >= ENTRY_KEYS
    assert entry["measured"] in MEASURED, f"{entry['id']}: measured {entry['measured']!r} is not in the vocabulary"
    assert entry["agreement"] in AGREEMENT and entry["agreement"] != "not run", f"{entry['id']}: {entry['agreement']!r}"
    if entry["agreement"] == "partly":
        assert entry["condition"].strip(), f"{entry['id']}: 'partly' without a condition"
    assert entry["status"] == label(entry["agreement"], entry["measured"], entry["condition"])
    assert isinstance(entry["summary"], str) and entry["summary"].strip(), f"{entry['id']}: empty summary"
    assert isinstance(entry["evidence"], dict) and entry["evidence"], f"{entry['id']}: no evidence"
    assert entry["seconds"] >= 0


def test_vocabulary_is_enforced():
    check("converges", "agrees")
    check("J decreased", "partly", "only with group-std GRAE")
    for measured, agreement, condition in (("holds", "agrees", ""), ("converges", "holds", ""), ("J decreased", "partly", ""),
                                           ("violated", "disagrees", ""), ("converges", "Agrees", "")):
        with pytest.raises(ValueError):
            check(measured, agreement, condition)
    with pytest.raises(ValueError):
        Verdict("converges", "holds only under something", "summary")
    assert Verdict("J decreased", "partly", "s", condition="c").status == "partly (c); measured: J decreased"


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.id)
def test_claim_is_well_formed(claim):
    assert claim.id.strip() and claim.id == claim.id.strip()
    assert claim.statement.strip(), f"{claim.id}: empty statement"
    assert claim.source.strip(), f"{claim.id}: empty source"
    assert isinstance(claim.assumptions, str)
    needs = claim.needs(QUICK)
    assert needs and all(isinstance(j, Job) for j in needs.values())
    assert callable(claim.judge)


def test_claim_ids_are_unique_and_cover_the_paper():
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids))
    assert {"A", "B", "C", "D"} <= set(ids)  # docs/method.md §3's claims
    assert set(TABLE1_CLAIMS.values()) <= set(ids)  # every Table 1 cell with a claim has its registry entry


def test_identical_measurements_are_shared():
    # the RLOO runs of A and C, and the shared-parameter search of C and D, are one measurement each
    keys = {cid: {j.key for j in c.needs(QUICK).values()} for cid, c in ((c.id, c) for c in CLAIMS)}
    assert keys["A"] & keys["C"] and keys["C"] & keys["D"]
    assert len({k for ks in keys.values() for k in ks}) < sum(len(ks) for ks in keys.values())
    assert job(measure_search, name="x", seed=1).key == job(measure_search, seed=1, name="x").key


def test_unknown_claim_id_is_rejected():
    with pytest.raises(ValueError, match="unknown claims"):
        check_all(QUICK, ids=["no-such-claim"])


def test_fast_claims_give_verdicts_in_the_vocabulary():
    report = check_all(QUICK, ids=FAST, workers=1)
    entries = {e["id"]: e for e in report["claims"]}
    assert list(entries) == [c.id for c in CLAIMS if c.id in FAST]  # registry order, each once
    for entry in entries.values():
        check_entry(entry)
    for cid in PROVED:
        assert (entries[cid]["measured"], entries[cid]["agreement"]) == ("proved", "agrees"), entries[cid]["summary"]
    assert report["budget"]["instances"] == QUICK.instances
    json.dumps(report)  # JSON-ready
    text = markdown(report)
    assert all(f"## {cid}:" in text for cid in FAST)


def test_search_uses_saved_counterexample_or_record(tmp_path):
    # a saved counterexample is replayed; a search recorded as finding nothing is read from searches.json
    saved = measure_search("gspo_st_stochastic", "paper_repro/counterexamples", fresh=0, seed=1, unrecorded=5)
    assert saved["found"] and saved["reproduces"] and saved["file"].endswith("gspo_st_stochastic.json")
    recorded = measure_search("grpo_mt_bandit", "paper_repro/counterexamples", fresh=0, seed=1, unrecorded=5)
    assert not recorded["found"] and recorded["recorded"]["examples"] >= 100 and "fresh" not in recorded
    # with neither, the search runs now
    (tmp_path / "cx").mkdir()
    fresh = measure_search("grpo_mt_bandit", str(tmp_path / "cx"), fresh=0, seed=1, unrecorded=3)
    assert "recorded" not in fresh and fresh["fresh"]["examples"] >= 3


@pytest.mark.slow
def test_table1_claims_agree_with_verify():
    # the same cells and rules: GSPO-ST disagrees (saved counterexample), GRPO-ST agrees, in both reports
    from seeupo.experiments.verify import QUICK as VQ, VerifyConfig, table1_rows, verify

    ids = ["T1-GSPO-ST", "T1-GRPO-ST", "T1-PPO-MT"]
    report = check_all(QUICK, ids=ids, workers=1)
    claims = {e["id"]: e for e in report["claims"]}
    for entry in claims.values():
        check_entry(entry)
    assert (claims["T1-GSPO-ST"]["measured"], claims["T1-GSPO-ST"]["agreement"]) == ("J decreased", "disagrees")
    assert claims["T1-GRPO-ST"]["agreement"] == "agrees"
    rows = {"gspo", "grpo", "ppo"}
    table = verify(VerifyConfig(**{**VQ.__dict__, "workers": 1}),
                   rows=[r for r in table1_rows(VQ.exact_epochs) if r.name in rows])["table1"]
    for e in table:
        for setting in ("ST", "MT"):
            cid = TABLE1_CLAIMS.get((e["row"], setting))
            if cid in claims:
                assert (e[setting]["measured"], e[setting]["agreement"]) == (claims[cid]["measured"], claims[cid]["agreement"]), cid


@pytest.mark.slow
def test_all_claims_get_a_verdict_and_the_report_serialises():
    progress: list[str] = []
    report = check_all(QUICK, progress=progress.append)
    assert [e["id"] for e in report["claims"]] == [c.id for c in CLAIMS]
    assert progress[0].startswith(f"claims: {len(CLAIMS)} claims from ")  # said before the first measurement
    assert len(progress) == 1 + len(CLAIMS)  # then one line per claim
    for entry in report["claims"]:
        check_entry(entry)
    text = json.dumps(report)
    assert json.loads(text)["claims"][0]["id"] == CLAIMS[0].id
    md = markdown(report)
    for claim in CLAIMS:
        assert f"| {claim.id} |" in md and f"## {claim.id}:" in md


def test_budgets_are_ordered():
    assert QUICK.instances < Budget().instances and QUICK.iterations < Budget().iterations
    assert QUICK.table1 == "quick" and Budget().table1 == "default"


def test_every_search_names_a_registered_claim():
    from seeupo.experiments.searches import SEARCHES

    ids = {c.id for c in CLAIMS}
    for spec in SEARCHES:
        assert spec.claim in ids, f"search {spec.name} names claim {spec.claim!r}, not in the registry"
