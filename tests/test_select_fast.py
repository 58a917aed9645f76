"""`counterfactual select`'s fast reader: a well-formed file read as a table equals what
`read_coco` reads; anything `read_coco` would report sends the file to it; worker processes
write the same bytes as one process."""

import json
import math

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from test_select_cli import instances, one_at_a_time

import counterfactual.cli.select as select_cli
from counterfactual.boxtable import BoxTable
from counterfactual.cli import main
from counterfactual.method.selection import (
    SelectionConfig,
    candidates_table,
    select_many,
    select_table,
)
from counterfactual.readers.coco import read_coco
from counterfactual.readers.coco_boxes import read_coco_boxes


def rich_coco(n=60, seed=1):
    """Polygons, crowd RLEs in both forms, string and integer ids, file names in folders,
    annotations out of image order, extra keys: everything a real file has."""
    rng = np.random.default_rng(seed)
    names = ["person", "dog", "cat", "car", "kite"]
    images, anns = [], []
    for i in range(1, n + 1):
        ident = f"img-{i}" if i % 7 == 0 else i
        w, h = int(rng.integers(20, 90)), int(rng.integers(20, 90))
        images.append({"id": ident, "file_name": f"a/{i}.jpg", "width": w, "height": h, "x": 1})
        for _ in range(int(rng.integers(0, 7))):
            x, y = float(rng.uniform(-5, w)), float(rng.uniform(-5, h))
            bw, bh = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
            ann = {"id": len(anns) + 1, "image_id": ident, "category_id": int(rng.integers(1, 6))}
            ann["bbox"] = [x, y, bw, bh]
            kind = rng.integers(0, 4)
            if kind == 0:
                ann["segmentation"] = [
                    [x, y, x + bw, y, x + bw, y + bh],
                    [x, y, x + 1, y, x, y + 1],
                ]
            elif kind == 1:  # crowd, uncompressed RLE
                ann["iscrowd"] = 1
                ann["segmentation"] = {"size": [h, w], "counts": [h * w // 2, h * w - h * w // 2]}
            elif kind == 2:  # crowd, compressed RLE
                m = np.zeros((h, w), np.uint8, order="F")
                m[: h // 2, : w // 3] = 1
                rle = mask_utils.encode(m)
                ann["iscrowd"] = 1
                ann["segmentation"] = {"size": [h, w], "counts": rle["counts"].decode()}
            anns.append(ann)
    order = rng.permutation(len(anns))
    cats = [{"id": k + 1, "name": c, "supercategory": "x"} for k, c in enumerate(names)]
    return {"images": images, "annotations": [anns[i] for i in order], "categories": cats}


def write(tmp_path, data, name="inst.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def same_table(a: BoxTable, b: BoxTable) -> None:
    assert list(a.image_ids) == list(b.image_ids)
    assert np.array_equal(a.width, b.width) and np.array_equal(a.height, b.height)
    assert np.array_equal(a.owner, b.owner) and np.array_equal(a.bbox, b.bbox)
    assert [a.classes[c] for c in a.category] == [b.classes[c] for c in b.category]


def test_the_table_is_what_read_coco_reads(tmp_path):
    path = write(tmp_path, rich_coco())
    boxes = read_coco_boxes(path)
    assert boxes is not None  # the fast path takes a file like this
    ids: dict = {}
    records = read_coco(path, None, tmp_path, original_ids=ids).records
    same_table(boxes.table, BoxTable.from_records(records))
    assert boxes.original_ids == [ids[r.image_id] for r in records]
    config = SelectionConfig(policy="all")
    assert select_table(boxes.table, config) == select_many(records, config)
    assert candidates_table(boxes.table, config) == candidates_table(
        BoxTable.from_records(records), config
    )


def _edit(path_in_data, value):
    def apply(data):
        *head, last = path_in_data
        target = data
        for key in head:
            target = target[key]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
        return data

    return apply


_DELETE = object()


def _add(key, entry):
    def apply(data):
        data[key].append(entry)
        return data

    return apply


HOSTILE = {
    "bbox-string": _edit(["annotations", 3, "bbox"], "bad"),
    "bbox-three-numbers": _edit(["annotations", 3, "bbox"], [1, 2, 3]),
    "bbox-negative-width": _edit(["annotations", 3, "bbox"], [1, 2, -3, 4]),
    "bbox-nan": _edit(["annotations", 3, "bbox"], [1, 2, math.nan, 4]),
    "bbox-bool": _edit(["annotations", 3, "bbox"], [1, 2, True, 4]),
    "unknown-category": _edit(["annotations", 3, "category_id"], 99),
    "category-as-string": _edit(["annotations", 3, "category_id"], "1"),
    "category-as-float": _edit(["annotations", 3, "category_id"], 1.0),
    "unlisted-image": _edit(["annotations", 3, "image_id"], 10_000),
    "iscrowd-2": _edit(["annotations", 3, "iscrowd"], 2),
    "odd-polygon": _edit(["annotations", 3, "segmentation"], [[1, 2, 3, 4, 5, 6, 7]]),
    "polygon-string": _edit(["annotations", 3, "segmentation"], [[1, 2, "a", 4, 5, 6]]),
    "polygon-overflow": _edit(["annotations", 3, "segmentation"], [[1, 2, 3, 4, 5, 1e999]]),
    "rle-short": _edit(["annotations", 3, "segmentation"], {"size": [2, 2], "counts": [1, 2]}),
    "rle-other-size": _edit(["annotations", 3, "segmentation"], {"size": [2, 2], "counts": [1, 3]}),
    "annotation-a-string": _add("annotations", "oops"),
    "duplicate-image": lambda d: _add("images", dict(d["images"][0]))(d),
    "blank-image-id": _edit(["images", 2, "id"], " "),
    "image-id-bool": _edit(["images", 2, "id"], True),
    "width-zero": _edit(["images", 2, "width"], 0),
    "width-float": _edit(["images", 2, "width"], 64.0),
    "file-outside": _edit(["images", 2, "file_name"], "../escape.jpg"),
    "file-missing": _edit(["images", 2, "file_name"], _DELETE),
    "category-no-name": _edit(["categories", 1, "name"], ""),
    "category-padded-id": _edit(["categories", 0, "id"], "01"),
    "category-twice": _add("categories", {"id": 1, "name": "zebra"}),
}


@pytest.mark.filterwarnings("ignore::counterfactual.readers.coco.AnnotationWarning")
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_anything_to_report_goes_to_read_coco_with_the_same_plans(tmp_path, capsys, name):
    data = HOSTILE[name](json.loads(json.dumps(rich_coco(n=30))))
    text = json.dumps(data).replace("Infinity", "1e999")  # JSON's overflow, as a file has it
    path = tmp_path / "inst.json"
    path.write_text(text)
    assert read_coco_boxes(path) is None
    out = tmp_path / "plans.jsonl"
    argv = ["select", "--annotations", str(path), "--out", str(out), "--policy", "all"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = one_at_a_time(path, SelectionConfig(policy="all"), False)
    ids: dict = {}
    read_coco(path, None, tmp_path, original_ids=ids)
    for row in expected:
        row["image_id"] = str(ids[row["image_id"]])
    assert rows == expected


def test_not_json_is_still_one_clear_error(tmp_path):
    path = tmp_path / "inst.json"
    path.write_text("{not json")
    assert read_coco_boxes(path) is None
    with pytest.raises(ValueError, match="not valid JSON"):
        read_coco(path, None, tmp_path)


@pytest.mark.parametrize("args", [[], ["--policy", "spurious"], ["--rejected"]])
def test_worker_processes_write_the_same_bytes(tmp_path, monkeypatch, args):
    monkeypatch.setattr(select_cli, "CHUNK", 50)  # several chunks, the last one partly filled
    path = write(tmp_path, rich_coco(n=230))
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    base = ["select", "--annotations", str(path), *args]
    assert main([*base, "--out", str(one), "--workers", "1"]) == 0
    assert main([*base, "--out", str(two), "--workers", "2"]) == 0
    assert one.read_bytes() == two.read_bytes() and one.stat().st_size > 0


def test_plans_of_a_clean_file_equal_one_image_at_a_time(tmp_path, capsys):
    path = instances(tmp_path / "inst.json", n=200, seed=4)
    data = json.loads(path.read_text())
    data["annotations"][5]["bbox"] = [1, 2, 3, 4]  # the helper's one bad entry mended
    path.write_text(json.dumps(data))
    assert read_coco_boxes(path) is not None
    assert main(["select", "--annotations", str(path), "--policy", "all"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = one_at_a_time(path, SelectionConfig(policy="all"), False)
    assert rows == expected  # ids as strings, as shards hold them
