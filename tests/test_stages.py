"""The steps keep every item: a failure inside a batch becomes that item's status row."""

import io
from pathlib import Path

import numpy as np

from counterfactual.image import EditRequest, ImageConfig
from counterfactual.records import Caption, ImageRecord, ObjectAnnotation
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.runner import run_local
from counterfactual.text import RewriteRequest, RewriteResult


class FailingEditor:
    """Zero fill that fails like a model (CUDA out of memory is a RuntimeError) on one seed."""

    def __init__(self, bad_seed):
        self.bad_seed = bad_seed
        self.calls = []

    def describe(self):
        return {"method": "failing-test-editor"}

    def __call__(self, batch: list[EditRequest]):
        self.calls.append(len(batch))
        if any(r.seed == self.bad_seed for r in batch):
            raise RuntimeError("CUDA out of memory")
        return [np.where(r.mask[..., None] > 0, 0, r.image).astype(np.uint8) for r in batch]


class FailingRewriter:
    def describe(self):
        return {"method": "failing-test-rewriter"}

    def __call__(self, batch: list[RewriteRequest]):
        if any("cat" in r.caption for r in batch):
            raise RuntimeError("device-side assert")
        return [RewriteResult("A PICTURE.") for r in batch]  # names no removed class


def records(tmp_path: Path, n: int) -> list[ImageRecord]:
    from PIL import Image

    out = []
    for i in range(n):
        buffer = io.BytesIO()
        Image.fromarray(np.full((60, 80, 3), 100 + i, np.uint8)).save(buffer, "JPEG")
        path = tmp_path / f"{i}.jpg"
        if not path.exists() or path.read_bytes() != buffer.getvalue():
            path.write_bytes(buffer.getvalue())  # the same picture keeps its mtime: a rerun resumes
        objects = (
            ObjectAnnotation((0, 0, 20, 20), "dog"),
            ObjectAnnotation((50, 30, 20, 20), "frisbee"),
        )
        text = "a cat and a dog" if i == 2 else "a dog and a frisbee"
        out.append(
            ImageRecord(str(i), f"{i}.jpg", 80, 60, objects, (Caption("c", text),), tmp_path)
        )
    return out


def test_a_model_failure_is_one_status_row_not_a_crash(tmp_path):
    recs = records(tmp_path, 5)
    config = SynthConfig(image=ImageConfig(method="zero"))
    # find the seed of record 1's item, to fail exactly that one
    from counterfactual.synth.plan import plan

    bad = plan(recs[1:2], config)[0][0].seed
    editor = FailingEditor(bad)
    result = run_local(
        recs,
        tmp_path / "out",
        config,
        editor=editor,
        rewriter=FailingRewriter(),
        runtime=Runtime(batch_size=5),
    )
    by_image = {s.image_id: (s.status, s.reason) for s in result.statuses if s.key}
    assert sum(s.reason == "not-drawn" for s in result.statuses) == 5  # dog or frisbee
    assert by_image["1"] == ("failed", "model-error")  # the editor failed on it
    assert by_image["2"] == ("failed", "model-error")  # the rewriter failed on it
    assert {by_image[i] for i in ("0", "3", "4")} == {("written", None)}
    # out of memory: the batch, then its halves (the cache freed), the bad one alone once
    assert editor.calls == [4, 2, 1, 1, 2]
    detail = next(s.detail for s in result.statuses if s.image_id == "1" and s.key)
    assert "CUDA out of memory" in detail
