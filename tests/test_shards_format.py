"""The shard format in its own package (`counterfactual.shards`): the plan and the verdict
defined once by `method/` (what `select` writes and what a sample's json holds are one struct),
the card's sections in order, and the readers of a run (`report`, `check`) on a real demo run
as a user types them, stdout and exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import msgspec
import pytest

from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.method.selection import PlanMeta, SelectionConfig, select, select_rows
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco
from counterfactual.shards import samples as sample_format
from counterfactual.shards.card import ShardEntry, card_text

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def coco_records(tmp_path_factory):
    files = generate_coco(tmp_path_factory.mktemp("coco"), 60, seed=5, write_images=False)
    return list(read_coco(files.instances, files.captions, files.images).records)


@pytest.mark.parametrize("policy", ["uniform", "all", "spurious"])
def test_a_plan_is_one_struct_from_select_to_the_sample_json(coco_records, policy) -> None:
    """`RemovalPlan.row()` is the sample json's `PlanMeta`; its json reads back equal; the rows
    `select` writes (made from the arrays) are the same bytes."""
    from counterfactual.boxtable import BoxTable

    config = SelectionConfig(policy=policy)
    stats = CooccurrenceStats.from_records(coco_records) if policy == "spurious" else None
    plans = [p for r in coco_records for p in select(r, config, stats, seed=3).plans]
    assert len(plans) > 20
    assert get_type_hints(sample_format.SampleMeta)["plan"] is PlanMeta
    for plan in plans:
        row = plan.row()
        assert type(row) is PlanMeta
        assert PlanMeta.from_dict(plan.to_dict()) == row
        assert ("pmi" in plan.to_dict()["evidence"]) == (policy == "spurious")
    rows, n_plans, _ = select_rows(BoxTable.from_records(coco_records), config, stats, seed=3)
    assert n_plans == len(plans)
    encode = msgspec.json.encode
    assert [encode(r) for r in rows] == [encode(p.row()) for p in plans]


def _card(shards, counts, inputs=4):
    return card_text(
        shards, counts=counts, inputs=inputs, unit="images", config={}, data={"kind": "coco"}
    )


def _headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


def test_the_card_reads_in_its_sections_order() -> None:
    typed = {"struct": {"a": "int64"}}
    held = _card([ShardEntry("shard-000000.tar", 3, typed)], {"written": 3, "failed:x": 1})
    assert held.startswith("---\nlicense: other\n")
    assert _headings(held) == ["# Counterfactual image-text pairs", "## Loading", "## License"]
    assert (
        "- 3 samples in 1 shards\n- from 4 input images of `coco`; status rows: 1 failed, 3 "
        in held
    )
    none = _card([ShardEntry("shard-000000.tar", 0)], {"failed:no-caption": 4})
    assert _headings(none) == [
        "# Counterfactual image-text pairs",
        "## Loading",
        "## No samples",
        "## License",
    ]
    mixed = [ShardEntry("a.tar", 1, typed), ShardEntry("b.tar", 1, {"struct": {"a": "string"}})]
    text = _card(mixed, {"written": 2})
    assert "No features are declared because their json differs in type at " in text
    assert text.index("No features") < text.index("## License") and text.endswith("dataset.\n")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_report_and_check_read_a_demo_run_as_a_user_types_them(tmp_path) -> None:
    out = tmp_path / "run"
    made = _cli("synth", "--config", "demo", "--runner", "local", "--out", str(out))
    assert made.returncode == 0, made.stderr
    checked = _cli("check", str(out))
    assert checked.returncode == 0, checked.stderr
    status = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    written = sum(r["status"] == "written" for r in status)
    assert written > 0 and (out / "README.md").read_text().count(f"{written:,} samples in")
    reported = _cli("report", str(out))
    assert reported.returncode == 0, reported.stderr
    assert (out / "report" / "index.html").is_file()
    (out / "shard-000000.tar").write_bytes(b"not a tar")
    damaged = _cli("check", str(out))
    assert damaged.returncode != 0
    assert "shard-000000.tar" in damaged.stdout + damaged.stderr
