"""The commands a user types: select's output contract and the demo run behind `make synth`."""

import json

import webdataset as wds

from counterfactual.cli import main
from counterfactual.readers.demo import prepare_demo


def test_select_writes_the_plan_contract(tmp_path, capsys):
    files = prepare_demo(tmp_path / "demo")
    out = tmp_path / "plans.jsonl"
    assert (
        main(
            [
                "select",
                "--dataset",
                "coco",
                "--annotations",
                str(files.instances),
                "--policy",
                "all",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    plans = [json.loads(line) for line in out.read_text().splitlines()]
    assert plans and all(p["valid"] for p in plans)
    for p in plans:
        assert {"image_id", "target", "removed", "kept", "kind", "evidence"} <= p.keys()
        assert p["target"] == p["removed"][0] and p["kind"] in ("single", "multi")
        assert set(p["evidence"]) == {"co_removal", "keep_overlap", "removed_fraction"}
    assert {p["kind"] for p in plans} == {"single", "multi"}
    err = capsys.readouterr().err
    assert f"{len(plans)} plans" in err

    assert (
        main(
            [
                "select",
                "--annotations",
                str(files.instances),
                "--rejected",
                "--out",
                str(out),
                "--seed",
                "3",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rejected = {r["rejected_by"] for r in rows if not r["valid"]}
    assert rejected == {"nothing-kept", "keep-overlap", "too-large"}
    # uniform policy: one plan per image that has any
    valid = [r["image_id"] for r in rows if r["valid"]]
    assert len(valid) == len(set(valid))


def test_demo_synth_as_make_synth_runs_it(tmp_path):
    out = tmp_path / "demo"
    assert main(["synth", "--dataset", "demo", "--out", str(out)]) == 0
    samples = list(
        wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False)
        .decode("pil")
        .to_tuple("jpg", "txt", "json")
    )
    assert len(samples) >= 5
    assert (out / "contact_sheet.png").stat().st_size > 0
    status = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert len({s["image_id"] for s in status}) == 8  # every demo image accounted for
    changed = [m for _, t, m in samples if t != m["original_caption"]]
    assert len(changed) >= 4  # the demo's word lists let np-removal find the removed objects
    for image, _text, meta in samples:
        assert image.size == (meta["width"], meta["height"])
        assert meta["image_method"] == {
            "method": "inpaint",
            "backend": "opencv",
            "algorithm": "telea",
            "radius": 3,
            "max_side": 192,
        }
