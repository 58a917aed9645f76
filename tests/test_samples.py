"""The shard data spec and reader (`counterfactual.shards.samples`): write-then-read round trips on the
shards of a real demo run, malformed jsons named by key, headers-only reading, committed shards
only, and the same rows through an S3 URL."""

import io
import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from sample_json import sample_json
from shard_files import shard_members

from counterfactual.cli import main
from counterfactual.method.verify import (
    ClassScore,
    Removal,
    Retention,
    TextCheck,
    VerifyMeta,
    VerifyResult,
    VerifySummary,
)
from counterfactual.records import ParquetCell, Status, TarMember
from counterfactual.shards import samples as samples_module
from counterfactual.shards.samples import (
    BAD_METADATA,
    BAD_SHARD,
    SampleMeta,
    iter_samples,
    read_member,
    read_samples,
    sample_failures,
    shard_paths,
    verify_summary_from_samples,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    args = ["synth", "--dataset", "demo", "--out", str(out), "--image-method", "blur"]
    assert main([*args, "--contact-sheet", "0"]) == 0
    return out


def written_keys(out: Path) -> list[str]:
    rows = map(json.loads, (out / "status.jsonl").read_text().splitlines())
    return [r["key"] for r in rows if r["status"] == "written"]


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# as a sample's json holds it: per-class checks as lists of records
RESULT = VerifyResult(
    passed=False,
    failed=("removal",),
    removal={"dog": Removal(ClassScore(1, 0.9123456789), ClassScore(2, 0.25), False)},
    retention={"person": Retention(ClassScore(3, 0.125), True)},
    text=TextCheck(("dog",), None),
    model="tiny-clip",
    k=1,
    retention_k=5,
)
VERIFY = RESULT.meta().to_dict()


def test_a_verdict_converts_directly_as_its_dict_reads():
    # the direct conversion equals the older route through the dict keyed by class
    assert RESULT.meta() == VerifyMeta.from_dict(RESULT.to_dict())
    assert VERIFY["removal"] == [
        {"class": "dog", "rank_before": 1, "rank_after": 2, "prob_before": 0.912346,
         "prob_after": 0.25, "removed": False}
    ]  # fmt: skip


# --- the spec ---------------------------------------------------------------------------------


def test_every_json_of_a_real_run_round_trips_byte_for_byte(run):
    jsons = {n: b for n, b in shard_members(run).items() if n.endswith(".json")}
    assert len(jsons) == len(written_keys(run)) > 3
    for data in jsons.values():
        d = json.loads(data)
        meta = SampleMeta.from_dict(d)
        assert meta.to_dict() == d and list(meta.to_dict()) == list(
            SampleMeta.from_json(data).to_dict()
        )
        # as the writer serialises it: the same bytes
        assert json.dumps(meta.to_dict(), ensure_ascii=False, sort_keys=True).encode() == data
        assert meta.plan.removed and meta.mask_boxes == meta.plan.mask_boxes
        assert meta.source is meta.detection is meta.best_of_n is meta.verify is None


@pytest.mark.parametrize(
    "extra",
    [
        {"verify": VERIFY},
        {"verify": {**VERIFY, "text": None, "passed": True, "failed": []}},
        {"best_of_n": {"picked": 1, "seed": 77, "scores": [0.5, 0.25, 1]}},
        {
            "detector": {"model": "owl", "queries": "caption", "score_threshold": 0.1},
            "objects": [
                {"category": "dog", "bbox": [1, 2.5, 3, 4], "score": 0.75},
                {"category": "person", "bbox": [0.0, 0.0, 8.0, 8.0], "score": None},
            ],
            "not_drawn": ["person"],
        },
        {"source": {"kind": "tar", "path": "s3://b/x.tar", "offset": 1536, "size": 9}},
        {"source": {"kind": "parquet", "path": "t.parquet", "row_group": 0, "row": 3,
                    "column": "jpg"}},
        {"split": None, "image_method": None},
    ],
)  # fmt: skip
def test_optional_parts_round_trip(extra):
    d = sample_json("5", ["dog"], ["person"], **extra)
    meta = SampleMeta.from_dict(json.loads(json.dumps(d)))
    assert meta.to_dict() == d
    if "verify" in extra:
        assert meta.verify is not None and meta.verify.removal[0].rank_after == 2
    if "objects" in extra:
        assert meta.detection is not None and meta.detection.objects[0].bbox == (1, 2.5, 3, 4)
    if "source" in extra:
        assert isinstance(meta.source, TarMember | ParquetCell)


def test_to_dict_hands_out_copies():
    meta = SampleMeta.from_dict(sample_json())
    meta.to_dict()["plan"]["evidence"]["x"] = 1
    meta.to_dict()["image_method"]["method"] = "changed"
    assert meta.to_dict() == sample_json()


def _drop(key):
    def change(d):
        del d[key]

    return change


def _set(*path_value):
    *path, value = path_value

    def change(d):
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_drop("plan"), r"missing required field `plan`"),
        (_drop("sample_seed"), r"missing required field `sample_seed`"),
        (_set("width", "8"), r"Expected `int`, got `str` - at `\$\.width`"),
        (_set("width", True), r"Expected `int`, got `bool` - at `\$\.width`"),
        (_set("mask_pixels", 1.5), r"Expected `int`, got `float` - at `\$\.mask_pixels`"),
        (_set("caption", None), r"Expected `str`, got `null` - at `\$\.caption`"),
        (_set("removed_phrases", "a dog"), r"Expected `array`, got `str` - at `\$\.removed_phrases`"),
        (_set("plan", "removed", "dog"), r"Expected `array`, got `str` - at `\$\.plan\.removed`"),
        (_set("plan", "kept", [1]), r"Expected `str`, got `int` - at `\$\.plan\.kept\[0\]`"),
        (_set("plan", "mask_boxes", [[1, 2, 3]]),
         r"Expected `array` of length 4, got 3 - at `\$\.plan\.mask_boxes\[0\]`"),
        (_set("mask_boxes", [[1, 2, 3, "4"]]),
         r"Expected `int \| float`, got `str` - at `\$\.mask_boxes\[0\]\[3\]`"),
        (_set("plan", "evidence", []), r"Expected `object`, got `array` - at `\$\.plan\.evidence`"),
        (_set("plan", "evidence", {"ratio": 1}),
         r"unknown field `ratio` - at `\$\.plan\.evidence`"),
        (_set("plan", "extra", 1), r"unknown field `extra` - at `\$\.plan`"),
        (_set("extra", 1), "unknown field `extra`"),
        (_set("verify", {**VERIFY, "k": None}), r"Expected `int`, got `null` - at `\$\.verify\.k`"),
        (_set("verify", {**VERIFY, "removal": {"dog": {"rank_before": 1}}}),
         r"missing required field `rank_after` - at `\$\.verify\.removal\[0\]`"),
        (_set("verify", {k: v for k, v in VERIFY.items() if k != "retention_k"}),
         r"missing required field `retention_k` - at `\$\.verify`"),
        (_set("best_of_n", {"picked": "0", "seed": 1, "scores": []}),
         r"Expected `int`, got `str` - at `\$\.best_of_n\.picked`"),
        (_set("detector", {}), "missing key objects"),
        (_set("source", {"kind": "zip"}), r"Invalid value 'zip' - at `\$\.source\.kind`"),
        (_set("mask", {"source": "box", "dilate": 0, "boxes": "x", "frame": [8, 8]}),
         r"Invalid enum value 'x' - at `\$\.mask\.boxes`"),
    ],
)  # fmt: skip
def test_malformed_json_names_the_key(change, message):
    d = sample_json()
    change(d)
    with pytest.raises(ValueError, match=message):
        SampleMeta.from_dict(d)


def test_not_json_and_not_an_object():
    with pytest.raises(ValueError, match="not JSON"):
        SampleMeta.from_json(b"{not json")
    with pytest.raises(ValueError, match="not JSON"):
        SampleMeta.from_json(b"\xff\xfe")
    with pytest.raises(ValueError, match="Expected `object`, got `array`"):
        SampleMeta.from_json(b"[1, 2]")


# --- reading shards ---------------------------------------------------------------------------


def test_iter_samples_reads_every_written_sample(run):
    members = shard_members(run)
    rows = list(iter_samples(run))
    assert [r.key for r in rows] == written_keys(run)
    for r in rows:
        assert r.shard_name == "shard-000000.tar" and r.meta.key == r.key
        assert r.jpg == members[f"{r.key}.jpg"] == read_member(r.shard, r.jpg_at)
        assert r.caption == members[f"{r.key}.txt"].decode() == r.meta.caption
        assert read_member(r.shard, r.json_at) == members[f"{r.key}.json"]
    # a list of shard paths reads the same; sample_failures finds nothing
    assert list(iter_samples(shard_paths(run))) == rows
    assert sample_failures(run) == []


class _Recording(io.FileIO):
    """A file that records every byte range read from it."""

    reads: list[tuple[int, int]] = []

    def read(self, size=-1):
        start = self.tell()
        data = super().read(size)
        self.reads.append((start, start + len(data)))
        return data

    def readinto(self, buffer):
        start = self.tell()
        n = super().readinto(buffer)
        self.reads.append((start, start + (n or 0)))
        return n


def test_images_false_reads_headers_and_json_but_no_jpg_bytes(run, monkeypatch):
    with tarfile.open(run / "shard-000000.tar") as tar:
        jpgs = [(m.offset_data, m.offset_data + m.size) for m in tar if m.name.endswith(".jpg")]
    assert jpgs
    _Recording.reads = []
    monkeypatch.setattr(samples_module.fs, "open_file", lambda path, mode="rb": _Recording(path))
    rows = list(iter_samples(run, images=False))
    assert len(rows) == len(jpgs) and all(r.jpg is None and r.jpg_at for r in rows)
    assert _Recording.reads
    for a, b in _Recording.reads:
        assert not any(a < end and start < b for start, end in jpgs), (a, b)
    # the same reader with images reads them
    _Recording.reads = []
    assert all(r.jpg for r in iter_samples(run))
    assert any(a < end and start < b for a, b in _Recording.reads for start, end in jpgs)


def test_uncommitted_and_foreign_shards_are_not_listed(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    shutil.copy(out / "shard-000000.tar", out / "shard-000001.tar")  # no stats: unfinished
    shutil.copy(out / "shard-000000.tar", out / "shard-000010.tar")
    shutil.copy(out / "shard-000000_stats.json", out / "shard-000010_stats.json")
    shutil.copy(out / "shard-000000.tar", out / "other-000002.tar")
    shutil.copy(out / "shard-000000_stats.json", out / "other-000002_stats.json")
    (out / "shard-000003_stats.json").write_text("{}")  # stats without its tar
    assert shard_paths(out) == [out / "shard-000000.tar", out / "shard-000010.tar"]
    assert shard_paths(out, prefix="other") == [out / "other-000002.tar"]
    assert len(list(iter_samples(out, images=False))) == 2 * len(written_keys(run))
    assert shard_paths(tmp_path / "nowhere") == []


def test_unreadable_samples_come_back_as_statuses(tmp_path):
    good = json.dumps(sample_json("1")).encode()
    shard = write_tar(
        tmp_path / "shard-000000.tar",
        [
            ("a.jpg", b"jpg-a"), ("a.json", good), ("a.txt", b"a caption"),
            ("b.jpg", b"jpg-b"), ("b.json", b"{not json"), ("b.txt", b"x"),
            ("c.jpg", b"jpg-c"), ("c.txt", b"no json"),
            ("d.json", json.dumps({**sample_json("4"), "width": "wide"}).encode()),
            ("e.json", good),  # no jpg, no txt: still a sample
        ],
    )  # fmt: skip
    rows = list(read_samples([shard]))
    assert [(r.key, r.reason if isinstance(r, Status) else "ok") for r in rows] == [
        ("a", "ok"), ("b", BAD_METADATA), ("c", BAD_METADATA), ("d", BAD_METADATA), ("e", "ok"),
    ]  # fmt: skip
    assert rows[0].jpg == b"jpg-a" and rows[0].caption == "a caption"
    assert rows[4].jpg is None and rows[4].jpg_at is None and rows[4].caption is None
    assert "no json member" in rows[2].detail
    assert "Expected `int`, got `str` - at `$.width`" in rows[3].detail
    assert all(s.key == s.image_id and s.status == "failed" for s in rows[1:4])
    assert [s.key for s in sample_failures([shard])] == ["b", "c", "d"]
    with pytest.raises(ValueError, match="bad-metadata: shard-000000.tar: b.json: sample json"):
        list(iter_samples([shard]))


def test_a_truncated_shard_ends_with_a_bad_shard_status(run, tmp_path):
    data = (run / "shard-000000.tar").read_bytes()
    cut = tmp_path / "shard-000000.tar"
    cut.write_bytes(data[: len(data) // 2])
    for images in (True, False):
        rows = list(read_samples([cut], images=images))
        assert rows[-1].reason == BAD_SHARD and rows[-1].detail.startswith("shard-000000.tar: ")
        assert 0 < len(rows) - 1 < len(written_keys(run))
    # a member whose data runs past the end of the file
    with tarfile.open(run / "shard-000000.tar") as tar:
        last = tar.getmembers()[-1]
    cut.write_bytes(data[: last.offset_data + 1])
    rows = list(read_samples([cut], images=False))
    assert rows[-1].reason == BAD_SHARD and f"{last.name} is cut off" in rows[-1].detail
    garbage = write_tar(tmp_path / "g.tar", [])
    garbage.write_bytes(b"not a tar at all" * 100)
    assert [r.reason for r in read_samples([garbage])] == [BAD_SHARD]


def test_verify_summary_from_the_samples(tmp_path):
    verdicts = [
        VERIFY,
        {**VERIFY, "passed": True, "failed": []},
        {**VERIFY, "failed": ["retention", "text"]},
    ]
    members = []
    for i, v in enumerate([*verdicts, None]):
        meta = sample_json(str(i)) if v is None else sample_json(str(i), verify=v)
        members += [(f"k{i}.jpg", b"jpg"), (f"k{i}.json", json.dumps(meta).encode())]
    write_tar(tmp_path / "shard-000000.tar", members)
    (tmp_path / "shard-000000_stats.json").write_text("{}")
    statuses = [
        Status("9", "failed", "verify-removal"),
        Status("9", "failed", "verify-removal"),
        Status("8", "failed", "decode-error"),
        Status("7", "written", key="k0"),
    ]
    expected = VerifySummary()
    for v in verdicts:
        expected.add(v)
    expected.dropped.update({"verify-removal": 2})
    got = verify_summary_from_samples(tmp_path, statuses)
    assert got == expected.to_dict()
    assert got["written_checked"] == 3 and got["written_passed"] == 1
    assert got["written_failed"] == {"removal": 1, "retention": 1, "text": 1}
    assert Counter(got["dropped"]) == Counter({"verify-removal": 2})
    # the same from the counts manifest.json keeps, for the shards named
    counts = Counter({"failed:verify-removal": 2, "failed:decode-error": 1, "written": 4})
    shards = [tmp_path / "shard-000000.tar"]
    assert verify_summary_from_samples(shards, counts=counts) == got


def test_the_same_rows_through_an_s3_url(run, s3):
    bucket = s3.bucket()
    s3.upload(run, f"{bucket}/run")
    url = f"{bucket}/run"
    assert shard_paths(url) == [f"{url}/shard-000000.tar"]
    local = list(iter_samples(run))
    remote = list(iter_samples(url))
    assert [(r.key, r.meta, r.caption, r.jpg, r.jpg_at) for r in remote] == [
        (r.key, r.meta, r.caption, r.jpg, r.jpg_at) for r in local
    ]
    assert read_member(remote[0].shard, remote[0].json_at) == read_member(
        local[0].shard, local[0].json_at
    )
    assert [r.jpg for r in iter_samples(url, images=False)] == [None] * len(local)
