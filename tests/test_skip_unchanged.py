"""``--skip-unchanged-captions``: a plan whose caption names no removed class is skipped with a
reason instead of pairing the edited picture with the caption as it was."""

import json

import pytest
from bad_coco import make_bad_coco, synth_args
from shard_files import shard_members

from counterfactual.cli import main
from counterfactual.text import TextConfig


def _metas(out):
    return {
        name[: -len(".json")]: json.loads(data)
        for name, data in shard_members(out).items()
        if name.endswith(".json")
    }


def _status(out):
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


def test_unchanged_captions_are_skipped_with_a_reason(tmp_path):
    files = make_bad_coco(tmp_path / "coco", n=30)
    common = ["--image-method", "blur", "--policy", "all", "--captions-per-image", "all"]
    common += ["--contact-sheet", "0", "--max-pixels", "1000000"]
    assert main(synth_args(files, tmp_path / "plain", *common)) == 0
    assert main(synth_args(files, tmp_path / "skip", *common, "--skip-unchanged-captions")) == 0
    plain, skip = _metas(tmp_path / "plain"), _metas(tmp_path / "skip")
    unchanged = {k for k, m in plain.items() if not m["removed_phrases"]}
    assert unchanged and unchanged != set(plain)  # the data has both kinds
    assert set(skip) == set(plain) - unchanged
    rows = {r["key"]: r for r in _status(tmp_path / "skip") if r.get("key")}
    for key in unchanged:
        assert (rows[key]["status"], rows[key]["reason"]) == ("skipped", "caption-unchanged")
    # nothing lost: every planned item of the plain run has a row in the other one
    assert {r["key"] for r in _status(tmp_path / "plain") if r.get("key")} == set(rows)


def test_only_for_np_removal():
    with pytest.raises(ValueError, match="np-removal only"):
        TextConfig(method="prompt", skip_unchanged=True)
