"""Caption text is clean before any step sees it: the rules, every reader, the sample json."""

from __future__ import annotations

import json
import pickle
import tarfile

import pytest
from bad_coco import synth_args
from sample_json import sample_json

from counterfactual.cli import main
from counterfactual.readers.clean import CleanText, clean_text
from counterfactual.readers.coco import read_coco
from counterfactual.readers.corpus import iter_table, iter_wds
from counterfactual.readers.generate import generate_coco
from counterfactual.records import Caption, ImageRecord
from counterfactual.shards.samples import SampleMeta
from counterfactual.synth.run import read_status
from counterfactual.testing.corpora import write_csv, write_shard

FLAG = "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"
"""England's flag: a black flag and tag characters (format characters that must stay)."""


@pytest.mark.parametrize(
    "raw,text,removed",
    [
        ("A dog on a mat.", "A dog on a mat.", 0),
        ("A dog\x00 on a mat", "A dog on a mat", 1),  # NUL removed
        ("a\x00b", "ab", 1),  # removed, not made a space
        ("A\tdog\non\r\na mat", "A dog on a mat", 4),  # tab, CR, LF become spaces
        ("a\x0bb\x0cc\x1cd\x85e", "a b c d e", 4),  # other controls Python calls whitespace
        ("bell\x07 esc\x1b[0m del\x7f c1\x9b", "bell esc[0m del c1", 4),
        ("zero\u200bwidth \ufeffBOM word\u2060joiner soft\u00adhyphen", "zerowidth BOM "
         "wordjoiner softhyphen", 4),
        ("lone \ud800surrogate", "lone surrogate", 1),
        ("  many   spaces\u00a0\u00a0and\u2028lines  ", "many spaces and lines", 0),
        ("\x00\x01\u200b  ", "", 3),
        # kept: emoji joiner sequences, ZWNJ (Persian), bidi marks, flag tags, combining marks
        ("family 👨\u200d👩\u200d👧", "family 👨\u200d👩\u200d👧", 0),
        ("می\u200cخواهم", "می\u200cخواهم", 0),
        ("abc \u200fשלום\u200e", "abc \u200fשלום\u200e", 0),
        (f"a {FLAG} flag", f"a {FLAG} flag", 0),
        ("cafe\u0301 naïve — 🐕", "cafe\u0301 naïve — 🐕", 0),
    ],
)  # fmt: skip
def test_clean_text_rules(raw, text, removed):
    cleaned = clean_text(raw)
    assert (cleaned.text, cleaned.removed) == (text, removed)
    cleaned.text.encode("utf-8")  # never a lone surrogate
    assert clean_text(cleaned.text) == CleanText(text, 0)  # cleaning twice changes nothing


def test_clean_text_refuses_what_is_not_text():
    with pytest.raises(TypeError, match="NoneType"):
        clean_text(None)  # type: ignore[arg-type]


def test_a_record_keeps_the_count_through_pickling():
    caption = Caption("7", "a dog", None, 3)
    record = ImageRecord("1", "a.jpg", 4, 4, (), (caption,))
    assert pickle.loads(pickle.dumps(record)).captions == (caption,)


def test_sample_json_has_the_count_only_when_something_was_removed():
    plain = sample_json()
    assert "caption_cleaned" not in plain
    assert SampleMeta.from_dict(plain).caption_cleaned == 0
    counted = {**plain, "caption_cleaned": 2}
    assert SampleMeta.from_dict(counted).to_dict() == counted
    for bad in (-1, "2", 1.5, True):
        with pytest.raises(ValueError, match="caption_cleaned"):
            SampleMeta.from_dict({**plain, "caption_cleaned": bad})


def test_coco_captions_are_cleaned_and_empty_ones_dropped(tmp_path):
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 8, "height": 8} for i in (1, 2)]
    caps = [
        {"id": 1, "image_id": 1, "caption": " A dog\x00\x00 on\ta\u200b mat. "},
        {"id": 2, "image_id": 1, "caption": "A  cat."},
        {"id": 3, "image_id": 2, "caption": "\x00\u200b\t"},
    ]
    (tmp_path / "i.json").write_text(json.dumps({"images": images, "annotations": []}))
    (tmp_path / "c.json").write_text(json.dumps({"annotations": caps}))
    by_id = {
        r.image_id: r for r in read_coco(tmp_path / "i.json", tmp_path / "c.json", tmp_path).records
    }
    assert by_id["1"].captions == (
        Caption("1", "A dog on a mat.", None, 4),
        Caption("2", "A cat.", None, 0),
    )
    assert by_id["2"].captions == ()


def test_corpus_captions_are_cleaned(tmp_path):
    picture = b"\xff\xd8 not decoded by the reader"
    samples = [
        ("a", picture, "A dog\x00 on a mat\u200b", {}),
        ("b", picture, "\x00\x00", {}),  # empty after cleaning: the json caption is used
        ("c", picture, None, {}),
    ]
    write_shard(samples, tmp_path / "0.tar")
    rows = {r.image_id: r for r in iter_wds(str(tmp_path / "0.tar"))}
    assert rows["a"].captions == (Caption("0", "A dog on a mat", None, 2),)
    assert rows["b"].captions == ()  # its json caption is the same NULs
    assert rows["c"].captions == ()
    table = write_csv(samples, tmp_path / "t.csv", tmp_path / "pictures")
    rows = {r.image_id: r for r in iter_table(str(table), "csv")}
    assert rows["a"].captions == (Caption("0", "A dog on a mat", None, 2),)
    assert rows["b"].captions == ()


def test_a_caption_empty_after_cleaning_is_no_caption_in_a_run(tmp_path):
    files = generate_coco(tmp_path / "coco", 2, seed=1, size=(96, 72))
    inst = json.loads(files.instances.read_text())
    for i in (1, 2):  # two small objects in opposite corners: a removable class each
        for k, (cat, x, y) in enumerate(((1, 0, 0), (18, 80, 56))):
            box = {"bbox": [x, y, 16, 16], "iscrowd": 0}
            inst["annotations"].append(
                {"id": 900 + 2 * i + k, "image_id": i, "category_id": cat, **box}
            )
    files.instances.write_text(json.dumps(inst))
    caps = json.loads(files.captions.read_text())
    for cap in caps["annotations"]:
        if cap["image_id"] == 2:
            cap["caption"] = "\x00\u200b\x07 "
        else:
            cap["caption"] = cap["caption"].replace(" ", "\x00 ", 1)
    files.captions.write_text(json.dumps(caps))
    out = tmp_path / "out"
    assert main(synth_args(files, out, "--image-method", "blur", "--contact-sheet", "0")) == 0
    rows = [(s.image_id, s.status, s.reason) for s in read_status(out)]
    assert ("2", "failed", "no-caption") in rows and ("1", "written", None) in rows
    assert [r for r in rows if r[0] == "2" and r[2] != "not-drawn"] == [
        ("2", "failed", "no-caption")
    ]
    samples = 0
    for shard in out.glob("shard-*.tar"):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    meta = json.loads(tar.extractfile(member).read())
                    assert meta["caption_cleaned"] == 1 and "\x00" not in meta["original_caption"]
                    samples += 1
                if member.name.endswith(".txt"):
                    assert b"\x00" not in tar.extractfile(member).read()
    assert samples == 1
