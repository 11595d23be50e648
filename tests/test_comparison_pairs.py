"""How ``build_comparison`` pairs an experiment's arms: a stage outside the comparison is no pair, the
baseline is the configured one, the server versions seen are merged, a damaged file is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncroll.experiment.comparison import build_comparison, validate_comparison
from asyncroll.experiment.report import aggregate
from tests.fake_comparison import comparison, nest


def experiment(baseline: str | None) -> dict[str, Any]:
    """A smoke arm (no pair) that failed, then two pairs of arms ``a`` and ``b``, run b first in pair 2."""
    plan: list[dict[str, Any]] = [
        {"id": "smoke-a", "stage": "smoke", "pair": None, "arm": "a", "policy": "fifo", "seed": 0}
    ]
    for p, order in enumerate((("a", "b"), ("b", "a"))):
        plan += [
            {"id": f"pair{p + 1}-{a}", "stage": "comparison", "pair": p, "arm": a, "policy": a, "seed": p}
            for a in order
        ]
    arms: dict[str, Any] = {e["id"]: {"status": "complete"} for e in plan}
    arms["smoke-a"] = {"status": "failed", "error": "server did not start"}
    arms["pair1-a"]["server_evidence"] = {"vllm_version": ["0.6.1"], "attention_backend": ["FLASH_ATTN"]}
    arms["pair2-b"]["server_evidence"] = {"vllm_version": ["0.6.1", "0.6.2"]}
    return {
        "config": {
            "name": "x",
            "arms": [{"name": "a", "policy": "fifo"}, {"name": "b", "policy": "asyncroll"}],
            "baseline": baseline,
            "seed": 0,
            "bootstrap_resamples": 200,
        },
        "status": "complete",
        "fingerprint": {"sha256": "f" * 64},
        "stages": {},
        "plan": plan,
        "arms": arms,
    }


SUMMARIES = {
    "pair1-a": nest({"makespan_s": 2.0}),
    "pair1-b": nest({"makespan_s": 1.0}),
    "pair2-a": nest({"makespan_s": 4.0}),
    "pair2-b": nest({"makespan_s": 2.0}),
}


def test_only_the_comparison_stages_arms_are_paired_and_a_failed_smoke_arm_is_listed() -> None:
    data = build_comparison(experiment("a"), SUMMARIES)
    validate_comparison(copy.deepcopy(data))
    assert [(p["pair"], p["seed"], p["order"], p["complete"]) for p in data["pairs"]] == [
        (1, 0, ["a", "b"], True),
        (2, 1, ["b", "a"], True),
    ]
    assert data["failed_arms"] == [
        {"id": "smoke-a", "stage": "smoke", "arm": "a", "error": "server did not start"}
    ]
    assert data["server_versions"] == {"vllm_version": ["0.6.1", "0.6.2"]}


def test_the_configured_baseline_is_the_one_compared_against() -> None:
    data = build_comparison(experiment("b"), SUMMARIES)
    assert data["baseline"] == "b"
    paired = aggregate(data)["paired"]
    assert list(paired) == ["a"] and paired["a"]["makespan_s"]["ratios"] == [2.0, 2.0]
    assert build_comparison(experiment(None), SUMMARIES)["baseline"] == "a"  # none given: the first arm


DAMAGE = {
    "duplicate_arm": (lambda c: c.update(arms=["a", "b", "b"]), "arms: duplicate names in ['a', 'b', 'b']"),
    "no_policy": (lambda c: c["policies"].pop("b"), "policies: no policy for ['b']"),
    "duplicate_metric": (lambda c: c["metrics"].append(c["metrics"][0]), "metrics: duplicate keys"),
    "extra_arm": (
        lambda c: c["pairs"][1]["arms"].update(z=c["pairs"][1]["arms"]["a"]),
        "pairs[1] (pair 2): arm(s) ['z'] are not in arms ['a', 'b']",
    ),
    "metric_left_out": (
        lambda c: c["pairs"][0]["arms"]["b"]["metrics"].pop("makespan_s"),
        "pairs[0] (pair 1).arms.b.metrics: no entry for ['makespan_s'] (null if not measured)",
    ),
    "pair_number_twice": (
        lambda c: c["pairs"][1].update(pair=1),
        "pairs: pair number(s) [1] appear more than once",
    ),
    "pair_0": (
        lambda c: c["pairs"][0].update(pair=0),
        "pairs[0].pair: Input should be greater than or equal to 1",
    ),
    "one_arm": (lambda c: c.update(arms=["a"]), "arms: List should have at least 2 items"),
    "no_resample": (
        lambda c: c.update(bootstrap_resamples=99),  # 1 was accepted: a zero-width "95%" interval
        "bootstrap_resamples: Input should be greater than or equal to 100",
    ),
    "nan_gate": (
        lambda c: c["stages"]["comparison"]["gates"][0].update(observed=float("nan")),
        "stages.comparison.gates[0].observed: Input should be a finite number",
    ),
}
GATE = {"metric": "makespan_s", "op": "<=", "value": 1.0, "arm": "b", "observed": 0.5, "passed": True}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_an_inconsistent_comparison_is_refused_naming_what_is_wrong(damage: str) -> None:
    data = comparison(
        [({}, {}), ({}, {})], stages={"comparison": {"status": "complete", "gates": [dict(GATE)]}}
    )
    validate_comparison(copy.deepcopy(data))
    change, message = DAMAGE[damage]
    change(data)
    with pytest.raises(ValueError) as info:
        validate_comparison(data)
    assert message in str(info.value)
