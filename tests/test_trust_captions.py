"""Caption matching on what a reader sees (issue 31, part 7): fullwidth and compatibility forms,
bidi controls and other format characters, Greek and Cyrillic lookalikes. The folding, the
vocabulary's matcher, np-removal's cut and the caption check, then a synth run as a user runs
it (a process) on captions holding those forms with the person removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from counterfactual.fold import CONFUSABLES, fold, readings, shown_order
from counterfactual.readers.clean import clean_text
from counterfactual.reasons import REASONS
from counterfactual.text import RewriteRequest
from counterfactual.text.np_removal import MentionCheck, NounPhraseRemover
from counterfactual.vocab import coco_vocabulary

ROOT = Path(__file__).resolve().parents[1]

HOSTILE = {
    "bidi override after": "A person\u202e beside a horse.",
    "bidi override before": "A\u202eperson beside a horse.",
    "bidi isolate": "A \u2067person\u2069 beside a horse.",
    "bidi marks": "A \u200eper\u200fson beside a horse.",
    "fullwidth": "Ａ ｐｅｒｓｏｎ beside a horse.",
    "fullwidth capital": "ＰＥＲＳＯＮ beside a horse.",
    "ligature": "A ﬁreman beside a horse.",
    "circled": "A ⓟⓔⓡⓢⓞⓝ beside a horse.",
    "superscript": "A ᵖᵉʳˢᵒⁿ beside a horse.",
    "mathematical bold": "A 𝐩𝐞𝐫𝐬𝐨𝐧 beside a horse.",
    "greek rho": "A \u03a1erson beside a horse.",
    "greek omicron": "A pers\u03bfn beside a horse.",
    "cyrillic": "A \u0440\u0435rson beside a horse.",
    "cyrillic capitals": "\u0420\u0415RSON beside a horse.",
    "zero-width joiner": "A per\u200dson beside a horse.",
    "zero-width non-joiner": "A per\u200cson beside a horse.",
    "zero-width space": "A per\u200bson beside a horse.",
    "soft hyphen": "A per\u00adson beside a horse.",
    "combining marks": "A pe\u0301rs\u0336on beside a horse.",
    "plural, fullwidth": "Two ｐｅｏｐｌｅ beside a horse.",
}
"""Captions that name a person as a reader sees them, but not in their bytes."""

SHOWN_REVERSED = "A horse beside a \u202enosrep"
"""Shown as "A horse beside a person": the override reverses the letters after it."""


@pytest.mark.parametrize(
    "raw,folded",
    [
        ("A person beside a horse.", "A person beside a horse."),
        ("Ａ ｐｅｒｓｏｎ", "A person"),
        ("A\u202eperson", "A person"),  # a bidi control splits the runs
        ("per\u200bson per\u00adson per\u200dson", "person person person"),  # invisible: joined
        ("\u03a1erson \u0440\u0435rson", "Person person"),
        ("ﬁreman ⓟ ᵖ x²", "fireman p p x2"),
        ("cafe\u0301 naïve", "cafe naive"),
        ("Ein Hund 🐕 — neben", "Ein Hund 🐕 — neben"),  # kept: not Latin lookalikes
        ("family 👨\u200d👩", "family 👨👩"),
    ],
)  # fmt: skip
def test_fold_reads_as_a_reader_sees(raw, folded):
    assert fold(raw).text == folded
    assert fold(folded).text == folded  # folding twice changes nothing


@pytest.mark.parametrize("caption", [*HOSTILE.values(), "Ｐ\u202eＥ\u0301r\u200bson"])
def test_every_folded_span_maps_back_to_the_characters_it_came_from(caption):
    folded = fold(caption)
    for start in range(len(folded.text)):
        for end in range(start + 1, len(folded.text) + 1):
            a, b = folded.span(start, end)
            assert 0 <= a < b <= len(caption)
            # the original span folds to the folded span (a ligature's half: to its whole)
            assert folded.text[start:end].strip() in fold(caption[a:b]).text


def test_ascii_folds_to_itself_without_a_map():
    folded = fold("A person, beside a horse.")
    assert folded.text == folded.original and folded.starts is None
    assert folded.span(2, 8) == (2, 8)


def test_lookalikes_are_single_latin_letters_of_another_script():
    for src, dst in CONFUSABLES.items():
        assert len(src) == len(dst) == 1 and dst.isascii() and dst.isalpha()
        assert not src.isascii() and unicodedata.category(src).startswith("L")


def test_an_override_reading_shows_the_letters_reversed():
    assert shown_order("ab\u202ecba\u202cd") == "ab abc d"
    assert "person" in readings(SHOWN_REVERSED)[-1]
    assert readings("A person.") == ("A person.",)


@pytest.mark.parametrize("name", HOSTILE)
def test_the_vocabulary_sees_the_class(name):
    vocabulary = coco_vocabulary()
    assert vocabulary.mentioned(HOSTILE[name]) == {"person", "horse"}
    assert vocabulary.may_mention(HOSTILE[name], ["person"])


@pytest.mark.parametrize(
    "caption,classes",
    [
        ("A personal note, a parsonage.", set()),  # a longer word is no mention
        ("Привет мир", set()),
        ("Ein Hund 🐕 neben a dog — naïve café.", {"dog"}),
        ("A horse beside a Person.", {"person", "horse"}),
        (SHOWN_REVERSED, {"person", "horse"}),
    ],
)
def test_the_vocabulary_matches_nothing_more(caption, classes):
    assert coco_vocabulary().mentioned(caption) == classes


@pytest.fixture(scope="module")
def remover():
    return NounPhraseRemover()


@pytest.mark.parametrize("name", HOSTILE)
def test_np_removal_cuts_the_hostile_form(remover, name):
    caption = HOSTILE[name]
    (result,) = remover([RewriteRequest(caption, ("person",))])
    assert result.text is not None and result.text.lower().endswith("beside a horse.")
    assert coco_vocabulary().mentioned(result.text) == {"horse"}
    assert all(unicodedata.category(ch) != "Cf" for ch in result.text)  # none left at the cut
    for phrase in result.removed_phrases:  # the characters cut are the caption's own
        assert phrase in caption


@pytest.mark.parametrize(
    "caption,removed,text",
    [
        ("A person beside a horse.", "person", "Beside a horse."),
        ("Two people, one with a hat, beside a dog.", "person", "One with a hat, beside a dog."),
        ("A man riding a horse near a café.", "horse", "A man riding near a café."),
        ("Ein Hund 🐕 neben a dog — naïve café.", "dog", "Ein Hund 🐕 neben — naïve café."),
    ],
)
def test_np_removal_of_normal_captions_is_unchanged(remover, caption, removed, text):
    (result,) = remover([RewriteRequest(caption, (removed,))])
    assert result.text == text


def test_the_caption_check_sees_what_a_reader_sees(remover):
    check = MentionCheck(coco_vocabulary())
    texts = [*HOSTILE.values(), SHOWN_REVERSED, "A horse.", None]
    named = check(texts, [("person", "horse")] * len(texts))
    assert named == [["person", "horse"]] * (len(HOSTILE) + 1) + [["horse"], []]
    # np-removal cannot cut what only the shown order names: the check must catch it
    (result,) = remover([RewriteRequest(SHOWN_REVERSED, ("person",))])
    assert check([result.text], [("person",)]) == [["person"]]


def test_the_mention_index_reads_as_np_removal_does():
    from counterfactual.eval.mentions import MentionIndexer

    texts = [HOSTILE["fullwidth"], HOSTILE["bidi marks"], HOSTILE["greek rho"], "A horse."]
    assert MentionIndexer()(texts) == [frozenset({"person", "horse"})] * 3 + [{"horse"}]


# the scenario: a synth run as a user types it

W, H = 96, 72
BOXES = [(1, [2, 2, 20, 16]), (19, [W - 22, H - 18, 20, 16])]  # a person and a horse, corners
NORMAL = "A person beside a horse."


def _dataset(root: Path) -> tuple[Path, Path, Path, dict[int, str]]:
    """One picture per caption, each with a person and a horse: a plan removes each."""
    images = root / "images"
    images.mkdir(parents=True)
    y, x = np.mgrid[0:H, 0:W]
    Image.fromarray(np.stack([x * 2, y * 3, x + y], -1).astype(np.uint8)).save(images / "p.png")
    captions = {i: c for i, c in enumerate([NORMAL, SHOWN_REVERSED, *HOSTILE.values()], 1)}
    inst = {
        "images": [{"id": i, "file_name": "p.png", "width": W, "height": H} for i in captions],
        "annotations": [
            {"id": 100 * k + i, "image_id": i, "category_id": cat, "bbox": box, "iscrowd": 0}
            for i in captions
            for k, (cat, box) in enumerate(BOXES, 1)
        ],
        "categories": [{"id": 1, "name": "person"}, {"id": 19, "name": "horse"}],
    }
    caps = {
        "annotations": [{"id": 900 + i, "image_id": i, "caption": c} for i, c in captions.items()]
    }
    (root / "instances.json").write_text(json.dumps(inst))
    (root / "captions.json").write_text(json.dumps(caps))
    return root / "instances.json", root / "captions.json", images, captions


def test_a_run_cuts_every_hostile_form_or_fails_it(tmp_path):
    instances, captions_file, images, captions = _dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [
        "synth", "--dataset", "coco", "--instances", str(instances), "--captions",
        str(captions_file), "--images", str(images), "--out", str(out), "--image-method", "blur",
        "--policy", "all", "--contact-sheet", "0", "--images-per-shard", "8",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    status = {(int(r["image_id"]), r["target"]): (r["status"], r["reason"]) for r in rows}
    plans = {(i, cls) for i in captions for cls in ("person", "horse")}
    assert set(status) == plans  # nothing lost: a row for every plan
    shards = sorted(str(p) for p in out.glob("shard-*.tar"))
    written = {}
    for sample in wds.WebDataset(shards, shardshuffle=False):
        meta = json.loads(sample["json"])
        text = sample["txt"].decode("utf-8")
        assert text == meta["caption"]
        # the caption as read (the reader takes out zero-width spaces and soft hyphens only)
        assert meta["original_caption"] == clean_text(captions[int(meta["image_id"])]).text
        written[int(meta["image_id"]), meta["plan"]["target"]] = text
    vocabulary = coco_vocabulary()
    for image_id, target in sorted(plans):
        if (image_id, target) in written:
            text = written[image_id, target]
            assert status[image_id, target] == ("written", None)
            assert target not in vocabulary.mentioned(text), (captions[image_id], text)
        elif target == "person":
            caption = captions[image_id]
            assert status[image_id, target] == ("failed", "caption-still-names"), caption
        else:  # the repair reads the caption's bytes: "A ⓟⓔⓡⓢⓞⓝ beside" may lose every word
            assert status[image_id, target][0] == "failed"
            assert status[image_id, target][1] in REASONS
    assert written[1, "person"] == "Beside a horse."  # the normal caption, as before
    assert written[1, "horse"] == "A person."
    # only its shown order names the person: np-removal cannot cut it, the check fails it
    assert status[2, "person"] == ("failed", "caption-still-names")
    cut = {(i, "person") for i in captions} - {(2, "person")}
    assert cut <= set(written)  # every other form is cut
