"""The whole loop on the controlled world, reduced, through the library's API
(:func:`run_experiment` with an :class:`ExperimentConfig`): world, synth, clean renders, the
scratch dual encoder trained on D and on D ∪ D' (``fine_tune``), both scored (``run_eval``).
Training on D ∪ D' must lower the model's reliance on co-occurring objects: ODmAP@1 up on the
pipeline's queries and on the clean renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from counterfactual.world.experiment import ARMS, METRICS, ROLES, ExperimentConfig, run_experiment


@pytest.mark.slow
def test_d_prime_lowers_the_reliance_on_co_occurring_objects(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    # 700 scenes keep comfortable margins (seeded: ODmAP@1 +0.086, clean +0.080; 1000: +0.116,
    # +0.106; 500 scenes and 60 steps: +0.024, +0.032, too thin)
    config = ExperimentConfig(seeds=1, images=700, test=200, steps=100, cooccurrence=0.95)
    lines: list[str] = []
    run_experiment(config, out, log=lines.append)
    assert lines[0].startswith("D: ") and any(line.startswith("seed 0 D+D': ") for line in lines)
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"config", "arms", "by_role"} and set(results["arms"]) == set(ARMS)
    for arm in results["arms"].values():
        assert set(arm) == {"mean", "std", "seeds"} and len(arm["seeds"]) == 1
        assert set(arm["mean"]) == set(METRICS)
        assert all(0 <= v <= 1 for m, v in arm["mean"].items() if not m.startswith("hub_skew"))
    d, dd = results["arms"]["D"]["mean"], results["arms"]["D+D'"]["mean"]
    assert dd["odmap@1"] > d["odmap@1"]
    assert dd["clean_odmap@1"] > d["clean_odmap@1"]
    # the roles split the queries: their weighted ODmAP is the arm's
    for arm in ARMS:
        roles = results["by_role"][arm]
        assert {"partner", "anchor", "unpaired"} <= set(roles) <= set(ROLES)
        for key in ("odmap@1", "clean_odmap@10"):
            n = sum(r["queries"] for r in roles.values())
            mean = sum(r["queries"] * r["mean"][key] for r in roles.values()) / n
            assert mean == pytest.approx(results["arms"][arm]["mean"][key])
    assert (out / "results.png").stat().st_size > 0
    summary = (out / "results.md").read_text()
    assert "ODmAP@1" in summary and "| a partner (its anchor stays: the shortcut) |" in summary


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="text_method"):
        ExperimentConfig(text_method="captioner")
    with pytest.raises(ValueError, match="cooccurrence"):
        ExperimentConfig(cooccurrence=0.3)
    with pytest.raises(ValueError, match="workers must be an integer >= 0, got -1"):
        ExperimentConfig(workers=-1)
    assert ExperimentConfig(workers=0).workers == 0
