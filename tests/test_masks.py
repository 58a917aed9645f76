"""Segmentation masks are pycocotools' own: polygons, RLE of both kinds, crowd objects."""

import json

import numpy as np
import pytest
from pycocotools import mask as coco_mask
from pycocotools.coco import COCO

from counterfactual.method.masks import MaskConfig, object_mask, plan_mask
from counterfactual.method.selection import RemovalPlan
from counterfactual.readers.coco import _compressed_runs, read_coco
from counterfactual.records import RLE, ImageRecord, ObjectAnnotation

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

W, H = 64, 48


def removing(record: ImageRecord, *classes: str) -> RemovalPlan:
    """A plan that removes ``classes`` (plan_mask reads only ``removed`` and ``mask_boxes``)."""
    boxes = tuple(o.bbox for o in record.objects if o.category in classes)
    return RemovalPlan(record.image_id, classes[0], classes, (), {}, {}, 0.0, boxes, 0.4, 0.8, 0.7)


def random_polygon(rng: np.random.Generator, small: bool) -> list[float]:
    """A star-shaped polygon (often concave), sometimes a few pixels across, off the grid."""
    n = int(rng.integers(3, 12))
    cx, cy = rng.uniform(-4, W + 4), rng.uniform(-4, H + 4)
    radius = rng.uniform(0.3, 4.0) if small else rng.uniform(2, 30)
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    r = radius * rng.uniform(0.3, 1.0, n)
    xy = np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1)
    return [round(float(v), 2) for v in xy.ravel()]


def write_coco(path, anns):
    """One image per annotation, read back by our reader and by pycocotools."""
    images = [
        {"id": i + 1, "file_name": f"{i}.jpg", "width": W, "height": H} for i in range(len(anns))
    ]
    full = [
        {"id": i + 1, "image_id": i + 1, "category_id": 1, "area": 1.0, **a}
        for i, a in enumerate(anns)
    ]
    data = {"images": images, "annotations": full, "categories": [{"id": 1, "name": "cat"}]}
    path.write_text(json.dumps(data))
    return COCO(str(path)), read_coco(path, None, path.parent)


def test_polygons_equal_pycocotools_exactly(tmp_path):
    rng = np.random.default_rng(0)
    anns = []
    for i in range(300):
        small = i % 3 == 0  # a third under 30 px, where rasterisers disagree most
        polys = [random_polygon(rng, small) for _ in range(int(rng.integers(1, 4)))]
        anns.append({"bbox": [0, 0, 1, 1], "iscrowd": 0, "segmentation": polys})
    coco, ds = write_coco(tmp_path / "inst.json", anns)
    assert len(ds.records) == 300 and not ds.failures
    small_pixels = 0
    for record in ds.records:
        (obj,) = record.objects
        expected = coco.annToMask(coco.loadAnns([int(record.image_id)])[0])
        got = object_mask(obj, H, W)
        assert got.dtype == np.uint8 and np.array_equal(got, expected), record.image_id
        painted = plan_mask(record, removing(record, "cat"), H, W, MaskConfig("segmentation"))
        assert np.array_equal(painted, expected * 255)
        small_pixels += int(record.image_id) % 3 == 1 and 0 < expected.sum() < 30
    assert small_pixels > 20  # the small objects were really small and really there


def random_mask(rng: np.random.Generator) -> np.ndarray:
    mask = np.zeros((H, W), np.uint8)
    for _ in range(3):
        x, y = rng.integers(0, W - 5), rng.integers(0, H - 5)
        mask[y : y + rng.integers(1, 20), x : x + rng.integers(1, 30)] = 1
    mask[rng.random((H, W)) < 0.02] = 1
    return mask


def uncompressed(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed counts: runs of 0s and 1s in column-major order, from 0s."""
    flat = np.asfortranarray(mask).ravel(order="F")
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return [0, *runs] if flat[0] else runs


def test_rle_of_both_kinds_and_crowd_use_their_mask(tmp_path):
    rng = np.random.default_rng(1)
    masks = [random_mask(rng) for _ in range(20)]
    anns = []
    for i, mask in enumerate(masks):
        if i % 2:
            rle = coco_mask.encode(np.asfortranarray(mask))
            seg = {"size": [H, W], "counts": rle["counts"].decode()}
        else:
            seg = {"size": [H, W], "counts": uncompressed(mask)}
        anns.append({"bbox": [0, 0, W, H], "iscrowd": 1, "segmentation": seg})
    coco, ds = write_coco(tmp_path / "inst.json", anns)
    assert len(ds.records) == 20 and not ds.failures
    for record, mask in zip(ds.records, masks, strict=True):
        (obj,) = record.objects
        assert obj.iscrowd and isinstance(obj.segmentation, RLE)
        expected = coco.annToMask(coco.loadAnns([int(record.image_id)])[0])
        assert np.array_equal(expected, mask)
        assert np.array_equal(object_mask(obj, H, W), mask)
        # the crowd's whole-image box is not what gets painted
        painted = plan_mask(record, removing(record, "cat"), H, W, MaskConfig("segmentation"))
        assert np.array_equal(painted, mask * 255)


def test_compressed_runs_decode_as_pycocotools():
    rng = np.random.default_rng(2)
    for _ in range(50):
        mask = random_mask(rng)
        counts = coco_mask.encode(np.asfortranarray(mask))["counts"].decode()
        assert _compressed_runs(counts) == uncompressed(mask)
    assert _compressed_runs("") == []
    assert _compressed_runs("x") is None  # out of range
    assert _compressed_runs("P") is None  # the continuation bit set on the last character
    assert _compressed_runs("12A") is None  # the third run negative


def test_union_with_boxes_dilation_and_other_sizes():
    tri = ((10.0, 10.0, 30.0, 10.0, 10.0, 30.0),)
    blob = np.zeros((H, W), np.uint8)
    blob[30:40, 40:60] = 1
    rle = coco_mask.encode(np.asfortranarray(blob))["counts"].decode()
    record = ImageRecord(
        "1",
        "1.jpg",
        W,
        H,
        (
            ObjectAnnotation((10, 10, 20, 20), "a", segmentation=tri),
            ObjectAnnotation((40, 30, 20, 10), "a", iscrowd=True, segmentation=RLE(H, W, rle)),
            ObjectAnnotation((0, 0, 5, 5), "a"),  # no segmentation: its box
            ObjectAnnotation((50, 0, 10, 10), "b", segmentation=tri),  # kept: not painted
        ),
        (),
    )
    plan = removing(record, "a")
    mask = plan_mask(record, plan, H, W, MaskConfig("segmentation"))
    expected = np.maximum(object_mask(record.objects[0], H, W), blob)
    expected[0:5, 0:5] = 1
    assert set(np.unique(mask)) == {0, 255} and np.array_equal(mask, expected * 255)
    grown = plan_mask(record, plan, H, W, MaskConfig("segmentation", dilate=2))
    assert (grown >= mask).all() and grown.astype(bool).sum() > mask.astype(bool).sum()
    # decoded at twice the annotated size: polygons and boxes scale, RLE is resized
    double = plan_mask(record, plan, 2 * H, 2 * W, MaskConfig("segmentation"))
    assert double.shape == (2 * H, 2 * W)
    assert double[60:80, 80:120].all() and not double[58, 78] and not double[82, 122]
    assert double[0:10, 0:10].all() and not double[0:20, 100:120].any()
    scaled_tri = [[2 * v for v in tri[0]]]
    big = coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(scaled_tri, 2 * H, 2 * W)))
    assert (double[big == 1] == 255).all()


@pytest.mark.parametrize(
    ("segmentation", "problem"),
    [
        ({"size": [H, W], "counts": [5, 7]}, f"cover 12 pixels, not {H} x {W} = {H * W}"),
        ({"size": [H, W], "counts": [H * W - 1, -1, 2]}, "neither ints >= 0 nor an RLE string"),
        ({"size": [H, W], "counts": [1.5, H * W - 1.5]}, "neither ints >= 0 nor an RLE string"),
        ({"size": [H, W], "counts": "x"}, "'x' is not a compressed RLE string"),
        ({"size": [H, W], "counts": ";280U2"}, "cover 100 pixels"),
        ({"size": [H], "counts": [H * W]}, "size [48] is not [height, width]"),
        ({"size": [2 * H, W], "counts": [2 * H * W]}, f"size [{2 * H}, {W}] is not the image's"),
        ({"counts": [H * W]}, "size None is not [height, width]"),
    ],
)
def test_a_bad_rle_fails_its_image_naming_the_entry(tmp_path, segmentation, problem):
    good = {"bbox": [1, 1, 2, 2], "iscrowd": 1, "segmentation": {"size": [H, W], "counts": [H * W]}}
    bad = {"bbox": [1, 1, 2, 2], "iscrowd": 1, "segmentation": segmentation}
    _, ds = write_coco(tmp_path / "inst.json", [good, bad])
    assert [r.image_id for r in ds.records] == ["1"]
    (failure,) = ds.failures
    assert (failure.image_id, failure.reason) == ("2", "bad-annotation")
    assert failure.detail.startswith("inst.json annotation 2: segmentation")
    assert problem in failure.detail
