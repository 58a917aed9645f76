"""COCO reader: annotations in, typed records and reasoned failures out."""

import json

import pytest

from counterfactual.readers.coco import karpathy_ids, read_coco
from counterfactual.records import RLE


@pytest.fixture
def files(tmp_path):
    instances = {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 100, "height": 80},
            {"id": 2, "file_name": "sub/b.jpg", "width": 50, "height": 50},
            {"id": 3, "file_name": "/etc/passwd", "width": 10, "height": 10},
            {"id": 4, "file_name": "c.jpg", "width": 10, "height": 10},
            {"id": 5, "file_name": "d.jpg", "width": 0, "height": 10},
            {"id": 6, "file_name": "e.jpg", "width": 10, "height": 10},
        ],
        "annotations": [
            {
                "image_id": 1,
                "category_id": 1,
                "bbox": [1, 2, 3, 4],
                "iscrowd": 0,
                "segmentation": [[1, 2, 4, 2, 4, 6]],
            },
            {
                "image_id": 1,
                "category_id": 18,
                "bbox": [10, 10, 5.5, 5],
                "iscrowd": 1,
                "segmentation": {"counts": "Zi05[2000000000fa6", "size": [80, 100]},
            },
            {"image_id": 4, "category_id": 77, "bbox": [1, 1, 1, 1]},
            {"image_id": 6, "category_id": 1, "bbox": [1, 1, -1, 1]},
        ],
        "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}],
    }
    captions = {
        "annotations": [
            {"id": 11, "image_id": 1, "caption": "  A man with a dog.  "},
            {"id": 12, "image_id": 1, "caption": ""},
            {"id": 13, "image_id": 2, "caption": "Nothing here."},
        ]
    }
    split = {"images": [{"cocoid": 1, "split": "restval"}, {"cocoid": 2, "split": "test"}]}
    paths = {}
    for name, data in (("instances", instances), ("captions", captions), ("split", split)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    return paths


def test_records_and_failures(files, tmp_path):
    ds = read_coco(files["instances"], files["captions"], tmp_path)
    by_id = {r.image_id: r for r in ds.records}
    assert set(by_id) == {"1", "2"}
    one = by_id["1"]
    assert (one.file, one.width, one.height, one.root) == ("a.jpg", 100, 80, tmp_path)
    assert [(o.category, o.bbox, o.iscrowd) for o in one.objects] == [
        ("person", (1.0, 2.0, 3.0, 4.0), False),
        ("dog", (10.0, 10.0, 5.5, 5.0), True),
    ]
    assert one.objects[0].segmentation == ((1.0, 2.0, 4.0, 2.0, 4.0, 6.0),)
    assert one.objects[1].segmentation == RLE(80, 100, "Zi05[2000000000fa6")  # crowd: its RLE
    assert [(c.caption_id, c.text) for c in one.captions] == [("11", "A man with a dog.")]
    assert by_id["2"].file == "sub/b.jpg" and by_id["2"].objects == ()
    failures = {f.image_id: (f.status, f.reason) for f in ds.failures}
    assert failures == {
        "3": ("failed", "unsafe-path"),
        "4": ("failed", "bad-annotation"),
        "5": ("failed", "bad-annotation"),
        "6": ("failed", "bad-annotation"),
    }
    assert "77" in next(f.detail for f in ds.failures if f.image_id == "4")
    assert ds.class_names == ("person", "dog")


def test_karpathy_split(files, tmp_path):
    assert karpathy_ids(files["split"], "train") == {"1"}  # restval counts as train
    ds = read_coco(files["instances"], files["captions"], tmp_path, files["split"], "test")
    assert [r.image_id for r in ds.records] == ["2"] and ds.records[0].split == "test"
    with pytest.raises(ValueError, match="split"):
        karpathy_ids(files["split"], "dev")


def test_bad_json_names_the_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        read_coco(bad, None, tmp_path)
