"""`counterfactual select`: the batched rules, ids as the file has them, the same plans as one
image at a time."""

import json

import numpy as np
import pytest
from pycocotools.coco import COCO

from counterfactual.cli import main
from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.method.selection import SelectionConfig, candidates, select
from counterfactual.readers.coco import read_coco
from counterfactual.vocab import coco_vocabulary


def instances(path, n=300, seed=0, string_ids=()):
    """COCO-format boxes at about COCO's statistics; ids in ``string_ids`` written as strings."""
    rng = np.random.default_rng(seed)
    classes = list(coco_vocabulary().classes)[:12]
    images, anns = [], []
    for i in range(1, n + 1):
        ident = str(i) if i in string_ids else i
        images.append({"id": ident, "file_name": f"{i}.jpg", "width": 64, "height": 48})
        chosen = rng.choice(len(classes), int(rng.integers(1, 5)), replace=False)
        for _ in range(int(rng.integers(1, 9))):
            w, h = (int(v) for v in rng.integers(2, 30, 2))
            x, y = int(rng.integers(-4, 60)), int(rng.integers(-4, 44))
            cls = int(rng.choice(chosen)) + 1
            anns.append(
                {"id": len(anns) + 1, "image_id": ident, "category_id": cls, "bbox": [x, y, w, h]}
            )
    anns[5]["bbox"] = "bad"  # one unreadable image
    cats = [{"id": k + 1, "name": c} for k, c in enumerate(classes)]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def one_at_a_time(path, config, rejected, seed=0):
    """What `select` wrote before it used the batched rules (ids then were strings)."""
    records = read_coco(path, None, path.parent).records
    stats = CooccurrenceStats.from_records(records)  # spurious: PMI over the whole file
    rows = []
    for record in records:
        rows += [p.to_dict() for p in select(record, config, stats, seed=seed).plans]
        if rejected:
            rows += [c.to_dict() for c in candidates(record, config).candidates if not c.valid]
    return rows


@pytest.mark.parametrize(
    "args",
    [[], ["--policy", "all"], ["--policy", "spurious", "--seed", "2"], ["--rejected"]],
    ids=["uniform", "all", "spurious", "rejected"],
)
def test_same_plans_as_one_image_at_a_time_with_string_ids(tmp_path, capsys, monkeypatch, args):
    """COCO's integer ids are written as the strings shards and status rows hold."""
    import counterfactual.cli.select as select_cli

    monkeypatch.setattr(select_cli, "CHUNK", 64)  # several chunks, one partly filled
    path = instances(tmp_path / "inst.json")
    out = tmp_path / "plans.jsonl"
    assert main(["select", "--annotations", str(path), "--out", str(out), *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    config = SelectionConfig(policy=args[1] if args[:1] == ["--policy"] else "uniform")
    expected = one_at_a_time(path, config, "--rejected" in args, seed=2 if "--seed" in args else 0)
    assert rows and all(type(r["image_id"]) is str for r in rows)
    assert rows == expected  # content and order
    err = capsys.readouterr().err
    assert "299 images" in err and "1 unreadable images" in err
    if "--rejected" in args:
        assert {r["rejected_by"] for r in rows} > {None}


def test_plans_join_with_pycocotools(tmp_path):
    path = instances(tmp_path / "inst.json", n=50)
    out = tmp_path / "plans.jsonl"
    assert main(["select", "--annotations", str(path), "--out", str(out), "--policy", "all"]) == 0
    coco = COCO(str(path))
    for row in map(json.loads, out.read_text().splitlines()):
        anns = coco.imgToAnns[int(row["image_id"])]  # the id as a string, as in shards
        names = {coco.cats[a["category_id"]]["name"] for a in anns}
        assert set(row["removed"]) | set(row["kept"]) <= names


def test_string_ids_stay_strings(tmp_path, capsys):
    path = instances(tmp_path / "inst.json", n=40, string_ids=set(range(1, 41, 2)))
    assert main(["select", "--annotations", str(path), "--policy", "all"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {type(r["image_id"]) for r in rows} == {str}  # integer and string ids alike
    file_ids = {str(im["id"]) for im in json.loads(path.read_text())["images"]}
    assert {r["image_id"] for r in rows} <= file_ids
