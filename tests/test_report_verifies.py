"""``counterfactual report`` verifies the shards it would read, as ``counterfactual check``
does: a truncated, emptied or byte-flipped tar, or a stats file whose tar is gone, is named one
line each, no report is written and the exit code is 1; ``--sizes-only`` skips the hash (what a
plain resume checks); after the synth rerun remakes the shard the report is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

RUN = ("--images-per-shard", "4", "--image-method", "blur", "--contact-sheet", "0")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 12, seed=3, size=(160, 120))


@pytest.fixture(scope="module")
def clean(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "out"
    assert main(synth_args(coco, out, *RUN)) == 0
    return out


def _report(out: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    code = main(["report", str(out), *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def _damage(tar: Path, how: str) -> None:
    data = tar.read_bytes()
    if how == "truncated":
        tar.write_bytes(data[: len(data) // 2])
    elif how == "emptied":
        tar.write_bytes(b"")
    elif how == "flipped":
        tar.write_bytes(data[:2000] + bytes([data[2000] ^ 0xFF]) + data[2001:])
    else:
        tar.unlink()


def test_an_intact_run_is_reported(clean, capsys):
    code, err = _report(clean, capsys, "--out", str(clean.parent / "report"))
    assert code == 0 and err == []
    assert (clean.parent / "report" / "index.html").is_file()


@pytest.mark.parametrize("how", ["truncated", "emptied", "flipped", "missing"])
def test_a_damaged_shard_is_named_and_no_report_written(coco, clean, tmp_path, capsys, how):
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    tars = sorted(out.glob("shard-*.tar"))
    assert len(tars) >= 2
    _damage(tars[1], how)
    if how != "missing":
        _damage(tars[0], "truncated")
    code, err = _report(out, capsys)
    assert code == 1
    assert not (out / "report").exists()
    first = [] if how == "missing" else [f"counterfactual report: {tars[0]}: damaged: "]
    expected = {
        "truncated": f"{tars[1]}: damaged: ",
        "emptied": f"{tars[1]}: damaged: 0 bytes, its stats file says ",
        "flipped": f"{tars[1]}: damaged: its SHA-256 is not the one its stats file records",
        "missing": f"{tars[1].with_name(tars[1].stem + '_stats.json')}: its tar ",
    }[how]
    assert len(err) == len(first) + 2, err
    for line, start in zip(err, [*first, f"counterfactual report: {expected}"], strict=False):
        assert line.startswith(start), err
    assert err[-1] == (
        f"counterfactual report: {len(first) + 1} damaged shard(s): no report written; rerun the "
        f"synth command to make them again (`counterfactual check {out}` checks the whole folder)"
    )
    if how == "flipped":  # the same size: only the hash tells
        shutil.copy(clean / tars[0].name, tars[0])
        assert _report(out, capsys, "--sizes-only")[0] == 0
        shutil.rmtree(out / "report")
    # the synth rerun makes the damaged shards again; the report is then written
    verify = ("--verify-shards",) if how == "flipped" else ()
    assert main(synth_args(coco, out, *RUN, *verify)) == 0
    capsys.readouterr()
    code, err = _report(out, capsys)
    assert code == 0 and err == [] and (out / "report" / "index.html").is_file()
