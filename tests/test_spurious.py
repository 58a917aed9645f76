"""The `spurious` selection policy and the co-occurrence counts, PMI and heat-maps behind it."""

import json
import math
import tarfile
from io import BytesIO

import numpy as np
import pytest
from PIL import Image
from sample_json import sample_json

from counterfactual.cli import main
from counterfactual.method.cooccurrence import (
    DPI,
    CooccurrenceStats,
    figure_size,
    present_classes,
)
from counterfactual.method.selection import (
    SelectionConfig,
    candidates,
    draw_index,
    select,
    select_many,
    spurious_score,
)
from counterfactual.readers.demo import read_demo
from counterfactual.records import ImageRecord, ObjectAnnotation
from counterfactual.shards.samples import synthetic_class_sets

SPURIOUS = SelectionConfig(policy="spurious")


def rec(image_id, classes, size=100):
    """An image with one small box per class, far apart (every single-class plan is valid)."""
    objs = tuple(
        ObjectAnnotation(bbox=(float(12 * i), float(12 * i), 10.0, 10.0), category=c)
        for i, c in enumerate(classes)
    )
    return ImageRecord(image_id, f"{image_id}.jpg", size, size, objs, ())


# The 4-image toy dataset of the hand computations below.
TOY = [
    rec("1", ["dog", "frisbee"]),
    rec("2", ["dog", "frisbee", "person"]),
    rec("3", ["dog", "person"]),
    rec("4", ["cat", "person"]),
]


def test_counts_and_pmi_by_hand():
    stats = CooccurrenceStats.from_records(TOY)
    assert stats.classes == ("cat", "dog", "frisbee", "person")
    assert stats.n_images == 4
    # diagonal: images containing the class; off-diagonal: images containing both
    assert stats.counts.tolist() == [
        [1, 0, 0, 1],
        [0, 3, 2, 2],
        [0, 2, 2, 1],
        [1, 2, 1, 3],
    ]
    i = stats.index
    plain = stats.pmi(smoothing=0.0)
    # PMI = log(p(a,b) / (p(a) p(b))) = log(N n_ab / (n_a n_b))
    assert plain[i["dog"], i["frisbee"]] == pytest.approx(math.log(4 * 2 / (3 * 2)))  # log 4/3
    assert plain[i["dog"], i["person"]] == pytest.approx(math.log(4 * 2 / (3 * 3)))  # log 8/9
    assert plain[i["frisbee"], i["person"]] == pytest.approx(math.log(4 * 1 / (2 * 3)))
    assert plain[i["cat"], i["person"]] == pytest.approx(math.log(4 * 1 / (1 * 3)))
    assert plain[i["cat"], i["dog"]] == -math.inf  # never together
    # smoothing s: log((n_ab + s) / (n_a n_b / N + s))
    smooth = stats.pmi(smoothing=1.0)
    assert smooth[i["dog"], i["frisbee"]] == pytest.approx(math.log(3 / 2.5))
    assert smooth[i["dog"], i["person"]] == pytest.approx(math.log(3 / 3.25))
    assert smooth[i["frisbee"], i["person"]] == pytest.approx(math.log(2 / 2.5))
    assert smooth[i["cat"], i["dog"]] == pytest.approx(math.log(1 / 1.75))
    assert np.array_equal(smooth, smooth.T)
    assert stats.count("dog", "frisbee") == 2 and stats.count("dog", "unicorn") == 0
    assert stats.frequency()[i["dog"], i["dog"]] == 0.75
    assert stats.top_classes(2) == ("dog", "person")  # 3 images each, then by name
    with pytest.raises(ValueError, match="smoothing"):
        stats.pmi(-1.0)


def test_policy_picks_the_hand_expected_class():
    """Image 2 keeps two classes whatever it removes; mean PMI (s = 1) with the kept ones:
    dog (log 1.2 + log 3/3.25) / 2 = 0.051, frisbee (log 1.2 + log 0.8) / 2 = -0.020,
    person (log 3/3.25 + log 0.8) / 2 = -0.152: dog goes."""
    sel = select_many(TOY, SPURIOUS)[1]
    (plan,) = sel.plans
    assert plan.target == "dog" and plan.kept == ("frisbee", "person")
    assert sel.not_drawn == ("frisbee", "person")
    assert plan.pmi == pytest.approx({"frisbee": math.log(1.2), "person": math.log(3 / 3.25)})
    evidence = plan.to_dict()["evidence"]["pmi"]
    assert evidence["score"] == pytest.approx((math.log(1.2) + math.log(3 / 3.25)) / 2)
    assert evidence["aggregate"] == "mean" and evidence["smoothing"] == 1.0
    assert spurious_score([1.0, 2.0]) == 1.5


def test_ties_are_a_seeded_draw_among_the_tied_plans():
    """Two classes: each is the other's only kept class, so both score the same PMI."""
    pair = [rec(str(i), ["cat", "dog"]) for i in range(12)] + [rec("x", ["cat", "bird"])]
    seen = set()
    for seed in range(4):
        config = SelectionConfig(policy="spurious")
        picks = [s.plans[0].target for s in select_many(pair, config, seed=seed)]
        assert picks[:12] == [["cat", "dog"][draw_index(seed, str(i), 2)] for i in range(12)]
        assert picks == [s.plans[0].target for s in select_many(pair, config, seed=seed)]
        seen.update(picks[:12])
    assert seen == {"cat", "dog"}


def test_stats_of_the_whole_dataset_decide_batches_alike():
    """A batch given the dataset's counts picks as the whole dataset does, in any order."""
    data = [*TOY, rec("5", ["dog", "frisbee", "cat"]), rec("6", ["frisbee", "person", "cat"])]
    stats = CooccurrenceStats.from_records(data)
    whole = [s.plans[0].target for s in select_many(data, SPURIOUS)]
    assert whole == [s.plans[0].target for s in select_many(data, SPURIOUS, stats)]
    halves = select_many(data[3:], SPURIOUS, stats) + select_many(data[:3], SPURIOUS, stats)
    assert [s.plans[0].target for s in halves] == whole[3:] + whole[:3]
    assert select(data[1], SPURIOUS, stats).plans[0].target == whole[1]
    # every choice scores at least as high as each valid alternative
    pmi, index = stats.pmi(1.0), stats.index
    for record, sel in zip(data, select_many(data, SPURIOUS), strict=True):
        chosen = sel.plans[0]
        for c in candidates(record, SPURIOUS).candidates:
            if c.valid:
                score = np.mean([pmi[index[c.target], index[k]] for k in c.kept])
                assert spurious_score(chosen.pmi.values()) >= score - 1e-12


def test_other_policies_ignore_stats_and_record_no_pmi():
    stats = CooccurrenceStats.from_records(TOY)
    for policy in ("uniform", "all"):
        config = SelectionConfig(policy=policy)
        a, b = select_many(TOY, config), select_many(TOY, config, stats)
        assert a == b
        for sel in a:
            for plan in sel.plans:
                assert plan.pmi is None and "pmi" not in plan.to_dict()["evidence"]


def test_images_that_do_not_qualify_keep_their_reasons():
    one_class = rec("solo", ["cat"])
    [sel] = select_many([one_class], SPURIOUS)
    assert sel.plans == () and sel.reason == "fewer-than-two-classes"


def test_presence_ignores_boxes_outside_the_picture():
    objs = (
        ObjectAnnotation((10.0, 10.0, 5.0, 5.0), "cat"),
        ObjectAnnotation((200.0, 10.0, 5.0, 5.0), "dog"),  # right of a 100 px wide image
        ObjectAnnotation((-5.0, 0.0, 10.0, 0.0), "bird"),  # no height
    )
    record = ImageRecord("a", "a.jpg", 100, 100, objs, ())
    assert present_classes(record) == {"cat"}
    records = [record, rec("b", []), *TOY]
    stats = CooccurrenceStats.from_records(records)
    assert stats.n_images == 6 and "dog" in stats.classes and "bird" not in stats.classes
    by_sets = CooccurrenceStats.from_class_sets(present_classes(r) for r in records)
    assert by_sets.classes == stats.classes and np.array_equal(by_sets.counts, stats.counts)
    empty = CooccurrenceStats.from_records([])
    assert empty.n_images == 0 and empty.classes == () and select_many([], SPURIOUS) == []


def test_json_round_trip_and_bad_input(tmp_path):
    stats = CooccurrenceStats.from_records(TOY)
    back = CooccurrenceStats.load(stats.save(tmp_path / "stats.json"))
    assert back.classes == stats.classes and back.n_images == 4
    assert np.array_equal(back.counts, stats.counts) and back.counts.dtype == np.int64
    with pytest.raises(ValueError, match="not co-occurrence counts"):
        CooccurrenceStats.from_dict({"classes": ["a"]})
    with pytest.raises(ValueError, match="symmetric"):
        CooccurrenceStats(("a", "b"), np.array([[1, 1], [0, 1]]), 2)
    with pytest.raises(ValueError, match=r"\[0, n_images"):
        CooccurrenceStats(("a",), np.array([[3]]), 2)


def test_adding_synthetic_images_adds_their_counts():
    """A synthetic image contains its kept classes only: after = before + those counts."""
    before = CooccurrenceStats.from_records(TOY)
    synthetic = CooccurrenceStats.from_class_sets([{"frisbee", "person"}, {"cat"}])
    after = before.combined(synthetic)
    assert after.n_images == 6
    assert after.classes == before.classes
    expected = before.counts.copy()
    i = before.index
    expected[i["frisbee"], i["person"]] += 1
    expected[i["person"], i["frisbee"]] += 1
    for c in ("frisbee", "person", "cat"):
        expected[i[c], i[c]] += 1
    assert np.array_equal(after.counts, expected)
    # a class only the synthetic side has joins the index
    grown = before.combined(CooccurrenceStats.from_class_sets([{"kite", "dog"}]))
    assert grown.count("kite", "dog") == 1 and grown.count("kite", "cat") == 0


def _write_shard(folder, metas):
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "shard-000000.tar", "w") as tar:
        for n, meta in enumerate(metas):
            for ext, data in (("txt", b"a caption"), ("json", json.dumps(meta).encode())):
                info = tarfile.TarInfo(f"k{n}.{ext}")
                info.size = len(data)
                tar.addfile(info, BytesIO(data))
    (folder / "shard-000000_stats.json").write_text("{}")  # committed


def test_cli_after_counts_are_before_plus_synthetic(tmp_path):
    """Hand-made shards on the demo: the same plan written with two captions is one image."""
    runs = tmp_path / "run"
    metas = [
        sample_json("1", ["flag"], ["person", "rocket"]),
        sample_json("1", ["flag"], ["person", "rocket"]),
        sample_json("7", ["rocket"], ["cat"]),
    ]
    _write_shard(runs, metas)
    assert synthetic_class_sets(runs) == ([{"person", "rocket"}, {"cat"}], 3)
    out = tmp_path / "heat" / "heat.png"
    args = ["cooccurrence", "--root", str(tmp_path / "demo"), "--synthetic", str(runs)]
    assert main([*args, "--out", str(out), "--top", "4"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    before = CooccurrenceStats.from_dict(data["before"])
    after = CooccurrenceStats.from_dict(data["after"])
    assert before.n_images == 8 and after.n_images == 10
    assert data["synthetic"] == {"images": 2, "samples": 3}
    delta = after.counts - before.counts
    i = before.index
    assert delta[i["person"], i["rocket"]] == delta[i["rocket"], i["person"]] == 1
    assert delta[i["person"], i["person"]] == delta[i["rocket"], i["rocket"]] == 1
    assert delta[i["cat"], i["cat"]] == 1
    assert delta.sum() == 5  # 2 + 1 diagonal entries for image 1, 1 for image 7, 2 pair entries
    assert len(data["classes"]) == 4 and data["classes"][0] == "person"
    assert np.array(data["matrices"]["difference"]).shape == (4, 4)
    with Image.open(out) as im:
        w, h = figure_size(4)
        assert im.size == (round(w * DPI), round(h * DPI))


def test_cli_refuses_a_folder_without_shards(tmp_path, capsys):
    args = ["cooccurrence", "--root", str(tmp_path / "demo"), "--synthetic", str(tmp_path)]
    assert main([*args, "--out", str(tmp_path / "h.png")]) == 2
    assert "no shard-*.tar" in capsys.readouterr().err


def test_synth_spurious_end_to_end_then_heatmap(tmp_path):
    """`synth --policy spurious` on the demo, then the heat-map of D and D ∪ D'."""
    run = tmp_path / "run"
    argv = ["synth", "--dataset", "demo", "--out", str(run), "--image-method", "blur"]
    assert main([*argv, "--policy", "spurious", "--contact-sheet", "0"]) == 0
    metas = []
    for shard in sorted(run.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.endswith(".json"):
                    metas.append(json.loads(tar.extractfile(m).read()))
    assert metas and all("pmi" in m["plan"]["evidence"] for m in metas)
    assert len({m["image_id"] for m in metas}) == len(metas)  # one plan per image

    out = tmp_path / "heat.png"
    argv = ["cooccurrence", "--synthetic", str(run), "--out", str(out), "--top", "20"]
    assert main([*argv, "--measure", "frequency"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    before = CooccurrenceStats.from_dict(data["before"])
    after = CooccurrenceStats.from_dict(data["after"])
    kept = CooccurrenceStats.from_class_sets([m["plan"]["kept"] for m in metas])
    assert np.array_equal(after.counts, before.combined(kept).counts)
    assert after.n_images == before.n_images + len(metas)
    n = len(data["classes"])
    plotted = np.array(data["matrices"]["after"])
    assert plotted.shape == (n, n)
    assert plotted == pytest.approx(after.aligned(data["classes"]) / after.n_images)
    # the chosen plans beat every other valid plan of their image on the dataset's counts
    pmi, index = before.pmi(1.0), before.index
    records = {r.image_id: r for r in read_demo(run / "demo-data").records}
    for m in metas:
        score = m["plan"]["evidence"]["pmi"]["score"]
        target, kept_classes = m["plan"]["target"], m["plan"]["kept"]
        assert score == pytest.approx(np.mean([pmi[index[target], index[k]] for k in kept_classes]))
        for c in candidates(records[m["image_id"]], SPURIOUS).candidates:
            if c.valid:
                assert score >= np.mean([pmi[index[c.target], index[k]] for k in c.kept]) - 1e-12
    with Image.open(out) as im:
        w, h = figure_size(n)
        assert im.size == (round(w * DPI), round(h * DPI))
