"""Flickr30k Entities reader on a tiny dataset written in the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from counterfactual.method.selection import SelectionConfig, candidates
from counterfactual.readers.flickr30k import (
    FormatError,
    parse_annotation,
    parse_sentence,
    read_flickr30k,
)
from counterfactual.records import Caption, ImageRecord, ObjectAnnotation, Phrase, Status

SENTENCES_1000 = """\
[/EN#1/people A man] in [/EN#5/clothing a red hat] rides [/EN#2/animals a brown horse] past [/EN#3/vehicles a car] .

[/EN#9/other [/EN#1/people The rider] 's shadow] falls on [/EN#2/animals/other the horse][/EN#6/bodyparts 's mane] .
[/EN#7/people Two women] listen to [/EN#4/instruments a guitar] .
"""  # noqa: E501  (the second line is blank on purpose: blank lines are not captions)


def _object(names: list[str], box: tuple[int, int, int, int] | None, scene: int = 0) -> str:
    out = "".join(f"<name>{n}</name>" for n in names)
    if box is None:
        out += f"<nobndbox>{1 - scene}</nobndbox><scene>{scene}</scene>"
    else:
        xmin, ymin, xmax, ymax = box
        out += (
            f"<bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin>"
            f"<xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox>"
        )
    return f"<object>{out}</object>"


ANNOTATION_1000 = (
    "<annotation><filename>1000.jpg</filename>"
    "<size><width>500</width><height>375</height><depth>3</depth></size>"
    + _object(["1"], (11, 21, 110, 220))  # the man: 1-based inclusive 11..110 -> x 10, w 100
    + _object(["7", "5"], (201, 51, 300, 150))  # a woman, shared with the hat (clothing)
    + _object(["7", "1"], (301, 101, 400, 200))  # shared by two people entities: listed once
    + _object(["2"], (1, 101, 500, 375))  # the horse, touching the right and bottom border
    + _object(["3"], (0, 0, 50, 40))  # a stray 0: clipped to the image
    + _object(["4"], None)  # the guitar is not visible
    + _object(["8"], None, scene=1)
    + _object(["6"], (120, 30, 140, 60))  # bodyparts: not a default type
    + _object(["9"], (100, 200, 250, 300))  # other
    + _object(["99"], (5, 5, 20, 20))  # an entity no caption mentions
    + "</annotation>"
)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def flickr(tmp_path: Path) -> Path:
    _write(tmp_path, "Sentences/1000.txt", SENTENCES_1000)
    _write(tmp_path, "Annotations/1000.xml", ANNOTATION_1000)
    _write(tmp_path, "Sentences/2000.txt", "[/EN#1/people A child] plays .\n")
    _write(tmp_path, "Annotations/2000.xml", "<annotation><size><width>10</width></size>")
    _write(tmp_path, "Sentences/3000.txt", "[/EN#1/people A dog] runs .\n")
    _write(tmp_path, "Sentences/4000.txt", "[/EN#1/people A woman sings .\n")
    _write(
        tmp_path,
        "Annotations/4000.xml",
        "<annotation><size><width>10</width><height>10</height></size></annotation>",
    )
    _write(
        tmp_path,
        "Annotations/5000.xml",
        "<annotation><size><width>10</width><height>10</height></size></annotation>",
    )
    _write(tmp_path, "train.txt", "1000\n2000\n")
    _write(tmp_path, "test.txt", "3000\n")
    return tmp_path


def test_reads_records_exactly(flickr: Path) -> None:
    ds = read_flickr30k(flickr, split="train")
    assert ds.name == "flickr30k"
    assert ds.class_names == ("people", "animals", "vehicles", "instruments")
    assert ds.records == (
        ImageRecord(
            image_id="1000",
            file="1000.jpg",
            width=500,
            height=375,
            objects=(
                ObjectAnnotation((10.0, 20.0, 100.0, 200.0), "people"),
                ObjectAnnotation((200.0, 50.0, 100.0, 100.0), "people"),
                ObjectAnnotation((300.0, 100.0, 100.0, 100.0), "people"),
                ObjectAnnotation((0.0, 100.0, 500.0, 275.0), "animals"),
                ObjectAnnotation((0.0, 0.0, 50.0, 40.0), "vehicles"),
            ),
            captions=(
                Caption(
                    "1000_0",
                    "A man in a red hat rides a brown horse past a car .",
                    (
                        Phrase(0, 5, "A man", ("people",), "1"),
                        Phrase(9, 18, "a red hat", ("clothing",), "5"),
                        Phrase(25, 38, "a brown horse", ("animals",), "2"),
                        Phrase(44, 49, "a car", ("vehicles",), "3"),
                    ),
                ),
                Caption(
                    "1000_1",
                    "The rider 's shadow falls on the horse's mane .",
                    (
                        Phrase(0, 19, "The rider 's shadow", ("other",), "9"),
                        Phrase(0, 9, "The rider", ("people",), "1"),
                        Phrase(29, 38, "the horse", ("animals", "other"), "2"),
                        Phrase(38, 45, "'s mane", ("bodyparts",), "6"),
                    ),
                ),
                Caption(
                    "1000_2",
                    "Two women listen to a guitar .",
                    (
                        Phrase(0, 9, "Two women", ("people",), "7"),
                        Phrase(20, 28, "a guitar", ("instruments",), "4"),
                    ),
                ),
            ),
            root=flickr / "flickr30k-images",
            split="train",
            dataset="flickr30k",
        ),
    )
    assert ds.failures == (Status("2000", "failed", "bad-annotation", ds.failures[0].detail),)
    assert "not well-formed XML" in ds.failures[0].detail


def test_phrase_offsets_index_the_clean_text(flickr: Path) -> None:
    for record in read_flickr30k(flickr).records:
        for caption in record.captions:
            assert "[" not in caption.text and "/EN#" not in caption.text
            for p in caption.phrases or ():
                assert caption.text[p.start : p.end] == p.text


def test_every_image_is_accounted_for(flickr: Path) -> None:
    ds = read_flickr30k(flickr)
    assert [r.image_id for r in ds.records] == ["1000"]
    assert ds.records[0].split is None
    reasons = {s.image_id: s.reason for s in ds.failures}
    assert reasons == {
        "2000": "bad-annotation",
        "3000": "missing-annotation",
        "4000": "bad-annotation",
        "5000": "missing-sentences",
    }
    assert all(s.status == "failed" for s in ds.failures)
    assert "never closed" in next(s.detail for s in ds.failures if s.image_id == "4000")
    test = read_flickr30k(flickr, split="test")
    assert test.records == () and [s.reason for s in test.failures] == ["missing-annotation"]


def test_types_choose_the_classes(flickr: Path) -> None:
    ds = read_flickr30k(flickr, split="train", types=("animals", "bodyparts"))
    assert ds.class_names == ("animals", "bodyparts")
    assert [(o.category, o.bbox) for o in ds.records[0].objects] == [
        ("animals", (0.0, 100.0, 500.0, 275.0)),
        ("bodyparts", (119.0, 29.0, 21.0, 31.0)),
    ]
    # the phrases keep every type, whatever ``types`` is
    assert ds.records[0].captions[1].phrases[3].types == ("bodyparts",)


def test_image_folder_is_configurable(flickr: Path, tmp_path: Path) -> None:
    assert read_flickr30k(flickr, images="jpg").records[0].root == flickr / "jpg"
    elsewhere = tmp_path / "pictures"
    assert read_flickr30k(flickr, images=elsewhere).records[0].root == elsewhere


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "val"}, "does not exist"),
        ({"split": "dev"}, "is not one of"),
        ({"types": ()}, "types"),
    ],
)
def test_bad_configuration_fails_loudly(flickr: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_flickr30k(flickr, **kwargs)


def test_missing_root_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        read_flickr30k(tmp_path / "nope")


def test_unsafe_ids_in_a_split_file_are_failures(flickr: Path) -> None:
    _write(flickr, "val.txt", "../../etc/passwd\n1000\n")
    ds = read_flickr30k(flickr, split="val")
    assert [r.image_id for r in ds.records] == ["1000"]
    assert [(s.image_id, s.reason) for s in ds.failures] == [("../../etc/passwd", "unsafe-path")]


@pytest.mark.parametrize(
    ("line", "text", "spans"),
    [
        ("A dog .", "A dog .", []),
        ("[/EN#3/animals A dog] .", "A dog .", [(0, 5, ("animals",), "3")]),
        (
            "[/EN#1/people/other A man][/EN#2/clothing 's hat]",
            "A man's hat",
            [(0, 5, ("people", "other"), "1"), (5, 11, ("clothing",), "2")],
        ),
        ("x ] y [ z", "x ] y [ z", []),  # stray brackets outside markup stay text
        ("[/EN#4/other  spaced ] out", " spaced  out", [(1, 7, ("other",), "4")]),
    ],
)
def test_parse_sentence(line: str, text: str, spans: list) -> None:
    clean, phrases = parse_sentence(line)
    assert clean == text
    assert [(p.start, p.end, p.types, p.entity_id) for p in phrases] == spans
    assert all(p.text == clean[p.start : p.end] for p in phrases)


@pytest.mark.parametrize("line", ["[/EN#1/people open", "[/EN#/people x]", "[/EN#1 x]"])
def test_parse_sentence_rejects_bad_markup(line: str) -> None:
    with pytest.raises(FormatError):
        parse_sentence(line)


@pytest.mark.parametrize(
    "xml",
    [
        "<annotation><size><width>10</width><height>10</height></size>",
        "<annotation><size><width>10</width></size></annotation>",
        "<annotation><size><width>0</width><height>10</height></size></annotation>",
        "<annotation><size><width>10</width><height>10</height></size>"
        + _object(["1"], (20, 1, 30, 5))
        + "</annotation>",
        "<annotation><size><width>10</width><height>10</height></size>"
        "<object><name>1</name><bndbox><xmin>a</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax>"
        "</bndbox></object></annotation>",
        "<annotation><size><width>10</width><height>10</height></size>"
        "<object><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax>"
        "</bndbox></object></annotation>",
    ],
)
def test_parse_annotation_rejects_bad_files(xml: str) -> None:
    with pytest.raises(FormatError):
        parse_annotation(xml)


def test_one_pixel_box() -> None:
    """VOC ``xmin == xmax`` is one pixel wide."""
    xml = (
        "<annotation><size><width>10</width><height>10</height></size>"
        + _object(["1", "2"], (3, 4, 3, 4))
        + "</annotation>"
    )
    width, height, boxes = parse_annotation(xml)
    assert (width, height) == (10, 10)
    assert [(b.entity_ids, b.xywh) for b in boxes] == [(("1", "2"), (2.0, 3.0, 1.0, 1.0))]


def test_records_feed_the_selection(flickr: Path) -> None:
    record = read_flickr30k(flickr, split="train").records[0]
    sel = candidates(record, SelectionConfig())
    assert [p.target for p in sel.candidates] == ["people", "animals", "vehicles"]


def test_synth_end_to_end_removes_phrases_by_type(flickr: Path, tmp_path: Path) -> None:
    import json

    import numpy as np
    import webdataset as wds
    from PIL import Image

    from counterfactual.cli import main

    images = flickr / "flickr30k-images"
    images.mkdir()
    Image.fromarray(np.full((375, 500, 3), 128, np.uint8)).save(images / "1000.jpg")
    out = tmp_path / "out"
    args = ["synth", "--dataset", "flickr30k", "--root", str(flickr), "--out", str(out)]
    assert (
        main([*args, "--image-method", "zero", "--policy", "all", "--captions-per-image", "all"])
        == 0
    )
    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("txt", "json"))
    assert samples
    for text, meta in samples:
        removed = set(meta["plan"]["removed"])
        for phrase in meta["removed_phrases"]:
            assert phrase not in text
        if meta["caption_id"] == "1000_0" and removed == {"animals"}:
            assert text == "A man in a red hat rides past a car."
    statuses = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert {s["image_id"] for s in statuses} >= {"1000", "2000", "3000", "4000", "5000"}
