"""Per-sample verification: the judging rules on hand-made scores, the caption check, the crop
geometry, the step in a run (a fake embedder whose scores we choose), and end to end through
`counterfactual synth` with a tiny random CLIP saved to disk."""

import json
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from bad_coco import make_bad_coco, synth_args

from counterfactual.cli import main
from counterfactual.image import ImageConfig
from counterfactual.imageio import SampleError
from counterfactual.method.selection import SelectionConfig
from counterfactual.method.verify import (
    REMOVAL,
    RETENTION,
    TEXT,
    UNKNOWN_CLASS,
    ClassScore,
    TextCheck,
    Verifier,
    VerifyConfig,
    VerifyRequest,
    class_boxes,
    class_score,
    crop_box,
    judge,
    text_check,
    zero_shot_ranks,
)
from counterfactual.records import Caption, ImageRecord, ObjectAnnotation
from counterfactual.synth.job import PLANNED, Job
from counterfactual.synth.plan import Runtime, SynthConfig, fingerprint_of, plan
from counterfactual.synth.staging import Chain, build_steps, step_order
from counterfactual.synth.steps import Verify
from counterfactual.text import TextConfig
from counterfactual.vocab import ClassVocabulary, coco_vocabulary

S = ClassScore


# ---- zero-shot ranks -------------------------------------------------------------------------


def test_zero_shot_ranks_order_ties_and_probabilities():
    classes = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    ranks, probs = zero_shot_ranks(np.array([[0.0, 1.0], [1.0, 0.0]]), classes)
    # tied classes share the best rank of the tie: 1 + classes scoring strictly higher
    assert ranks.tolist() == [[3, 1, 1, 3], [1, 2, 2, 4]]
    assert np.allclose(probs.sum(axis=1), 1.0)
    assert probs[0, 1] == probs[0, 2] and probs[0, 1] > 0.49  # exp(100) dwarfs exp(0)
    cos = np.array([[0.3, 0.2, 0.1]])
    _, p = zero_shot_ranks(cos, np.eye(3), logit_scale=10.0)
    e = np.exp(10 * cos[0])
    assert np.allclose(p[0], e / e.sum())
    ranks, probs = zero_shot_ranks(np.zeros((0, 2)), classes)
    assert ranks.shape == probs.shape == (0, 4)
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        zero_shot_ranks(np.zeros((1, 3)), classes)
    with pytest.raises(ValueError, match="no class"):
        zero_shot_ranks(np.zeros((1, 2)), np.zeros((0, 2)))


def test_class_absent_from_the_vocabulary_is_a_clear_error():
    ranks, probs = np.array([2, 1]), np.array([0.4, 0.6])
    assert class_score(ranks, probs, ("cat", "dog"), "dog") == S(1, 0.6)
    with pytest.raises(ValueError, match="'unicorn' is not in the verification vocabulary"):
        class_score(ranks, probs, ("cat", "dog"), "unicorn")


# ---- judging on hand-made scores -------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank_after", "k", "removed"),
    [(1, 5, False), (5, 5, False), (6, 5, True), (80, 5, True), (1, 1, False), (2, 1, True)],
)
def test_removed_means_out_of_the_top_k(rank_after, k, removed):
    result = judge({"dog": (S(1, 0.9), S(rank_after, 0.1))}, {}, None, k=k, retention_k=5)
    assert result.removal["dog"].removed is removed
    assert result.passed is removed and result.failed == (() if removed else (REMOVAL,))


@pytest.mark.parametrize(("rank", "kept"), [(1, True), (3, True), (4, False), (70, False)])
def test_kept_means_in_the_top_retention_k(rank, kept):
    result = judge({"dog": (S(1, 0.9), S(9, 0.0))}, {"frisbee": S(rank, 0.2)}, None, 5, 3)
    assert result.retention["frisbee"].kept is kept
    assert result.failed == (() if kept else (RETENTION,))


def test_a_tie_at_the_k_boundary_counts_as_still_there():
    """Ties share the best rank, so a removed class tied with the k-th class is not removed
    (conservative) and a kept class tied with the k-th is kept."""
    # image scores: a=0.9, b=c=dog=0.5 -> dog ties for rank 2
    classes = np.eye(4)
    ranks, probs = zero_shot_ranks(np.array([[0.9, 0.5, 0.5, 0.5]]), classes)
    names = ("a", "b", "c", "dog")
    after = class_score(ranks[0], probs[0], names, "dog")
    assert after.rank == 2
    assert not judge({"dog": (S(1, 1.0), after)}, {}, None, k=2, retention_k=2).passed
    assert judge({"dog": (S(1, 1.0), after)}, {}, None, k=1, retention_k=1).passed
    assert judge({}, {"dog": after}, None, k=1, retention_k=2).passed


def test_every_failed_check_is_reported_in_order_and_as_json():
    result = judge(
        {"dog": (S(1, 0.8), S(2, 0.3)), "frisbee": (S(3, 0.1), S(40, 0.001))},
        {"person": S(12, 0.01), "bench": S(1, 0.5)},
        TextCheck(("dog",), False),
        k=5,
        retention_k=5,
        model="hf-clip:tiny",
    )
    assert not result.passed and result.failed == (REMOVAL, RETENTION, TEXT)
    d = json.loads(json.dumps(result.to_dict()))
    assert d == {
        "passed": False,
        "failed": [REMOVAL, RETENTION, TEXT],
        "removal": {
            "dog": {
                "rank_before": 1,
                "rank_after": 2,
                "prob_before": 0.8,
                "prob_after": 0.3,
                "removed": False,
            },
            "frisbee": {
                "rank_before": 3,
                "rank_after": 40,
                "prob_before": 0.1,
                "prob_after": 0.001,
                "removed": True,
            },
        },
        "retention": {
            "person": {"rank": 12, "prob": 0.01, "kept": False},
            "bench": {"rank": 1, "prob": 0.5, "kept": True},
        },
        "text": {"names_removed": ["dog"], "names_kept": False},
        "model": "hf-clip:tiny",
        "k": 5,
        "retention_k": 5,
    }
    detail = result.detail()
    assert "dog rank 1->2" in detail and "frisbee" not in detail.split(";")[0]
    assert "person rank 12" in detail and "names dog and names no kept class" in detail


def test_passing_sample_and_bad_k():
    result = judge({"dog": (S(1, 0.9), S(30, 0.0))}, {"cat": S(2, 0.3)}, TextCheck((), True), 5, 5)
    assert result.passed and result.failed == () and result.detail() == ""
    assert result.to_dict()["text"] == {"names_removed": [], "names_kept": True}
    assert judge({}, {}, TextCheck((), None), 5, 5).passed  # names_kept None: not required
    for k in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="k must be an int >= 1"):
            judge({}, {}, None, k=k, retention_k=5)


# ---- text ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caption", "removed", "kept", "method", "expected"),
    [
        (
            "A man throws frisbees to two dogs.",
            ("dog",),
            ("frisbee",),
            "np-removal",
            (("dog",), True),
        ),
        ("Puppies on the grass.", ("dog",), ("frisbee",), "np-removal", (("dog",), False)),
        # the longest entry wins: hot dogs are hot dogs, not dogs
        ("Two hot dogs on a table.", ("dog",), ("dining table",), "np-removal", ((), True)),
        (
            "Two hot dogs on a table.",
            ("hot dog",),
            ("dining table",),
            "np-removal",
            (("hot dog",), True),
        ),
        ("Three men near a bench.", ("person",), ("bench",), "prompt", (("person",), True)),
        ("A photo of the benches.", ("person",), ("bench",), "prompt", ((), True)),
        ("A grassy field.", ("dog",), ("frisbee",), "np-removal", ((), False)),
        # a captioner must not name what is gone, but need not name what stays
        ("A grassy field.", ("dog",), ("frisbee",), "captioner", ((), None)),
        ("a dog-like shape", ("dog",), ("frisbee",), "captioner", (("dog",), None)),
    ],
)
def test_text_check(caption, removed, kept, method, expected):
    got = text_check(coco_vocabulary(), caption, removed, kept, method)
    assert (got.names_removed, got.names_kept) == expected
    assert got.passed is (not expected[0] and expected[1] is not False)


def test_text_check_skips_perturbed_captions_and_missing_ones():
    vocab = coco_vocabulary()
    for method in ("shuffle", "nouns-adj"):  # negatives by design: they keep every word
        assert text_check(vocab, "a dog and a frisbee", ("dog",), ("frisbee",), method) is None
    assert text_check(vocab, None, ("dog",), ("frisbee",), "np-removal") is None
    # nothing kept to name: the kept-class requirement does not apply
    assert text_check(vocab, "a field", ("dog",), (), "np-removal") == TextCheck((), None)


# ---- crop geometry ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("boxes", "size", "padding", "min_side", "expected"),
    [
        ([(10, 10, 20, 10)], (100, 100), 0.1, 1, (8, 9, 32, 21)),  # 10% of w and h each side
        ([(10, 10, 20, 10)], (100, 100), 0.0, 1, (10, 10, 30, 20)),
        ([(10.5, 10.5, 5, 5)], (100, 100), 0.0, 1, (10, 10, 16, 16)),  # outward to whole px
        ([(0, 0, 10, 10), (30, 40, 10, 10)], (100, 100), 0.0, 1, (0, 0, 40, 50)),  # union
        ([(0, 0, 20, 20)], (100, 100), 0.5, 1, (0, 0, 40, 40)),  # moved inside, same size
        ([(90, 80, 10, 20)], (100, 100), 0.5, 1, (80, 60, 100, 100)),  # moved inside
        ([(0, 0, 100, 50)], (100, 100), 0.1, 1, (0, 0, 100, 60)),  # wider than the image: cut
        ([(90, 90, 20, 20)], (100, 100), 0.0, 1, (90, 90, 100, 100)),  # box clipped first
        ([(50, 50, 4, 4)], (100, 100), 0.0, 32, (36, 36, 68, 68)),  # tiny: 32 px square
        ([(50, 50, 40, 4)], (100, 100), 0.0, 32, (50, 32, 90, 72)),  # thin: square of its length
        ([(0, 0, 4, 4)], (100, 100), 0.1, 32, (0, 0, 32, 32)),  # tiny in a corner
        ([(1, 1, 2, 2)], (20, 10), 0.0, 32, (0, 0, 20, 10)),  # image smaller than min_side
        ([(200, 200, 10, 10)], (100, 100), 0.1, 32, None),  # off the image
        ([(10, 10, 0, 5)], (100, 100), 0.1, 32, None),  # no area
        ([], (100, 100), 0.1, 32, None),
    ],
)
def test_crop_box(boxes, size, padding, min_side, expected):
    got = crop_box(boxes, size[0], size[1], padding, min_side)
    assert got == expected
    if got is not None:
        x0, y0, x1, y1 = got
        assert 0 <= x0 < x1 <= size[0] and 0 <= y0 < y1 <= size[1]


def test_class_boxes_scale_to_the_decoded_size():
    objects = (
        ObjectAnnotation((10, 5, 20, 10), "dog"),
        ObjectAnnotation((0, 0, 4, 4), "dog", iscrowd=True),
        ObjectAnnotation((50, 20, 10, 10), "frisbee"),
    )
    record = ImageRecord("1", "1.jpg", 100, 50, objects, ())
    boxes = class_boxes(record, ("dog", "cat"), height=100, width=200)
    assert boxes == {"dog": [(20, 10, 40, 20), (0, 0, 8, 8)], "cat": []}


# ---- the Verifier with an embedder whose scores we choose --------------------------------------

NAMES = ("dog", "cat", "frisbee", "person", "bench", "car", "bus", "kite", "boat", "tree")
VOCAB = ClassVocabulary({n: (["man", "men"] if n == "person" else []) for n in NAMES})


class CodeEmbedder:
    """Texts ``"a photo of a NAME."`` embed as the one-hot of NAME; an image whose commonest
    red value is ``j`` scores class ``c`` at ``1 / (1 + |c - j|)``, so class ``j`` ranks 1 and
    classes further from ``j`` rank worse."""

    def __init__(self, fail_on=None):
        self.texts, self.image_calls, self.fail_on = [], [], fail_on

    def embed_texts(self, texts):
        self.texts.append(list(texts))
        out = np.zeros((len(texts), len(NAMES)), np.float32)
        for i, t in enumerate(texts):
            out[i, NAMES.index(t.removeprefix("a photo of a ").removesuffix("."))] = 1
        return out

    def embed_images(self, images):
        self.image_calls.append(len(images))
        out = []
        for im in images:
            red = np.asarray(im)[..., 0].ravel()
            code = int(np.bincount(red).argmax())
            if code in (self.fail_on or ()):
                raise RuntimeError("CUDA out of memory")
            v = 1.0 / (1.0 + np.abs(np.arange(len(NAMES)) - code))
            out.append(v / np.linalg.norm(v))
        return np.array(out, np.float32)


def painted(boxes_codes, fill=9, size=(60, 80)):
    image = np.full((*size, 3), fill, np.uint8)
    for (x, y, w, h), code in boxes_codes:
        image[y : y + h, x : x + w, 0] = code
    return image


DOG, FRISBEE = (10, 10, 20, 20), (50, 30, 20, 20)


def request(after_code, caption="a man with a frisbee", method="np-removal"):
    original = painted([(DOG, NAMES.index("dog")), (FRISBEE, NAMES.index("frisbee"))])
    edited = painted([(DOG, after_code), (FRISBEE, NAMES.index("frisbee"))])
    return VerifyRequest(
        original, edited, {"dog": [DOG]}, {"frisbee": [FRISBEE]}, ("dog",), ("frisbee",),
        caption, method,
    )  # fmt: skip


def test_verifier_scores_crops_in_one_batch_and_judges():
    embedder = CodeEmbedder()
    verifier = Verifier(VerifyConfig(k=2, retention_k=1, min_box=8), VOCAB, embedder=embedder)
    assert embedder.texts == [[f"a photo of a {n}." for n in NAMES]]  # prompts embedded once
    erased, redrawn, near = request(9), request(0), request(1, caption="a dog")
    results = verifier([erased, redrawn, near])
    assert embedder.image_calls == [9]  # 3 x (dog before, dog after, frisbee after)
    ok, bad, close = (r.to_dict() for r in results)
    assert ok["passed"] and ok["removal"]["dog"]["rank_before"] == 1
    assert ok["removal"]["dog"]["rank_after"] == 10  # the crop now looks like class 9
    assert ok["retention"] == {"frisbee": {"rank": 1, "prob": ok["retention"]["frisbee"]["prob"],
                                           "kept": True}}  # fmt: skip
    assert ok["text"] == {"names_removed": [], "names_kept": True}
    assert bad["failed"] == [REMOVAL] and bad["removal"]["dog"]["rank_after"] == 1
    # code 1 (cat) is next to dog (0): dog ranks 2 <= k, and the caption still names the dog
    assert close["failed"] == [REMOVAL, TEXT] and close["removal"]["dog"]["rank_after"] == 2
    assert close["text"] == {"names_removed": ["dog"], "names_kept": False}
    assert verifier([]) == []
    no_text = Verifier(VerifyConfig(k=2, text_check=False), VOCAB, embedder=CodeEmbedder())
    assert no_text([near])[0].text is None


def test_verifier_refuses_unknown_classes_bad_images_and_a_k_too_large():
    verifier = Verifier(VerifyConfig(), VOCAB, embedder=CodeEmbedder())
    r = request(9)
    unknown = VerifyRequest(r.original, r.edited, {}, {}, ("unicorn",), ("frisbee",))
    with pytest.raises(SampleError, match="unicorn") as err:
        verifier([unknown])
    assert err.value.reason == UNKNOWN_CLASS
    small = VerifyRequest(r.original[:10], r.edited, {}, {}, ("dog",), ("frisbee",))
    with pytest.raises(ValueError, match="differ in size"):
        verifier([small])
    with pytest.raises(ValueError, match="below the number of vocabulary classes"):
        Verifier(VerifyConfig(k=10), VOCAB, embedder=CodeEmbedder())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "strict"}, "verify mode"),
        ({"k": 0}, "k must be"),
        ({"retention_k": True}, "retention_k must be"),
        ({"template": "a photo"}, "has no {}"),
        ({"template": "a {cls}"}, "not a format string"),
        ({"crop_padding": -0.1}, "crop_padding"),
        ({"model": ""}, "verify model"),
    ],
)
def test_config_is_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VerifyConfig(**kwargs)


def test_the_batch_size_is_the_verifiers():
    with pytest.raises(ValueError, match="batch_size must be"):
        Verifier(VerifyConfig(), VOCAB, embedder=CodeEmbedder(), batch_size=0)


# ---- the step in a run -----------------------------------------------------------------------


def test_config_fingerprint_and_step_wiring():
    off = SynthConfig()
    assert "verify" not in off.fingerprint()  # runs made before verification existed resume
    assert SynthConfig(verify=VerifyConfig(k=3)).fingerprint() == off.fingerprint()
    rec = SynthConfig(verify=VerifyConfig(mode="record"))
    assert rec.fingerprint() == {**off.fingerprint(), "verify": {"mode": "record"}}
    assert rec.fingerprint() != SynthConfig(verify=VerifyConfig(mode="filter")).fingerprint()
    assert step_order(off) == ("rewrite", "decode", "edit", "encode")
    assert step_order(rec) == ("rewrite", "decode", "edit", "verify", "encode")
    cap = SynthConfig(text=TextConfig(method="captioner"), verify=VerifyConfig(mode="filter"))
    assert step_order(cap) == ("decode", "edit", "rewrite", "verify", "encode")
    runtime = Runtime(device="cuda", verify_batch_size=7)
    spec = Verify.declare(rec, runtime)
    assert spec.uses_model and not Verify.declare(off, runtime).uses_model
    assert (spec.resources.device, spec.resources.batch_size) == ("cuda", 7)
    assert spec.needs == {"image", "edited", "caption", "plan"} and spec.drops == {"image"}
    recorded = rec.record(runtime)["verify"]  # where the manifest always had them
    assert list(recorded)[-2:] == ["device", "batch_size"]
    assert (recorded["device"], recorded["batch_size"]) == ("cuda", 7)
    assert fingerprint_of(rec.record(runtime)) == rec.fingerprint()

    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import layout_actors
    from counterfactual.synth.layout import Cluster
    from counterfactual.synth.staging import plan_stages

    stages = plan_stages(rec, runtime)
    assert [s.steps for s in stages] == [("rewrite", "decode", "edit"), ("verify",), ("encode",)]
    layout = layout_actors(stages, RayOptions(), Cluster.single(8, 2))
    assert layout.model_actors == (0, 2, 0)  # the verifier's own pool on the GPUs


def records(tmp_path: Path, n: int, codes=None) -> list[ImageRecord]:
    """Pictures with the dog and frisbee boxes painted in their class codes (or ``codes[i]``)."""
    from PIL import Image

    out = []
    for i in range(n):
        dog, frisbee = (codes or {}).get(i, (NAMES.index("dog"), NAMES.index("frisbee")))
        Image.fromarray(painted([(DOG, dog), (FRISBEE, frisbee)])).save(tmp_path / f"{i}.png")
        objects = (ObjectAnnotation(DOG, "dog"), ObjectAnnotation(FRISBEE, "frisbee"))
        caption = Caption("c", "a dog and a man with a frisbee")
        out.append(ImageRecord(str(i), f"{i}.png", 80, 60, objects, (caption,), tmp_path))
    return out


def run_jobs(recs, config, verifier):
    items = [i for p in plan(recs, config) if isinstance(p, list) for i in p]
    jobs = [Job(0, k, item) for k, item in enumerate(items)]
    return Chain(build_steps(config, verifier=verifier), PLANNED)(jobs)


def step_config(mode, policy="all"):
    return SynthConfig(
        image=ImageConfig(method="zero"),
        selection=SelectionConfig(policy=policy),
        verify=VerifyConfig(mode=mode, k=2, retention_k=8, min_box=8),
        images_per_shard=100,
    )


@pytest.mark.parametrize("mode", ["record", "filter"])
def test_the_step_records_or_filters(tmp_path, mode):
    recs = records(tmp_path, 4)
    config = step_config(mode)
    # the zero fill paints the removed box black (code 0 = dog): removing the frisbee leaves a
    # dog-like crop (frisbee at rank 3 > k) but removing the dog does not (dog rank 1)
    verifier = Verifier(config.verify, VOCAB, embedder=CodeEmbedder())
    jobs = run_jobs(recs, config, verifier)
    by_target = {}
    for job in jobs:
        by_target.setdefault(job.item.plan.target, []).append(job)
    assert set(by_target) == {"dog", "frisbee"} and len(jobs) == 8
    for job in jobs:
        assert job.image is None and job.edited is None  # pixels dropped once encoded
    dog, frisbee = by_target["dog"], by_target["frisbee"]
    if mode == "record":
        assert all(j.ok and j.sample is not None for j in jobs)
        meta = dog[0].sample.meta["verify"]  # per-class checks: lists of records
        assert meta["failed"] == [REMOVAL] and meta["removal"][0]["class"] == "dog"
        assert meta["removal"][0]["rank_after"] == 1
        (removal,) = frisbee[0].sample.meta["verify"]["removal"]
        assert removal["class"] == "frisbee" and removal["removed"]
        assert frisbee[0].sample.meta["verify"]["text"]["names_kept"] is True
    else:
        assert all(j.failure.reason == REMOVAL for j in dog)
        assert "dog rank 1->1" in dog[0].failure.detail
        assert all(j.ok and j.sample.meta["verify"]["passed"] for j in frisbee)


def test_a_model_error_is_one_status_row_not_a_crash(tmp_path):
    recs = records(tmp_path, 3, codes={1: (5, 6)})  # only image 1 has codes 5 and 6
    config = step_config("record", policy="uniform")
    embedder = CodeEmbedder(fail_on={5, 6})
    jobs = run_jobs(recs, config, Verifier(config.verify, VOCAB, embedder=embedder))
    reasons = {j.item.record.image_id: j.failure and j.failure.reason for j in jobs}
    assert reasons == {"0": None, "1": "model-error", "2": None}
    # out of memory: the batch (3 jobs of 3 crops), its halves, the failing half's halves
    assert embedder.image_calls == [9, 6, 3, 3, 3]
    detail = next(j.failure.detail for j in jobs if not j.ok)
    assert detail.startswith("verify:") and "CUDA out of memory" in detail
    assert all("verify" in j.sample.meta for j in jobs if j.ok)


def test_verification_off_changes_nothing(tmp_path):
    recs = records(tmp_path, 2)
    base = SynthConfig(image=ImageConfig(method="zero"))
    jobs = run_jobs(recs, base, None)
    assert all("verify" not in j.sample.meta for j in jobs)
    assert [s.name for s in build_steps(base)] == ["rewrite", "decode", "edit", "encode"]


# ---- end to end with a tiny random CLIP --------------------------------------------------------


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    pytest.importorskip("transformers")
    from tiny_clip import build_tiny_clip

    return f"hf-clip:{build_tiny_clip(tmp_path_factory.mktemp('clip') / 'clip')}"


# A random CLIP ranks mostly by the prompt, whatever the crop: k=40 and a loose retention_k
# give passes and removal failures; np-removal's captions add text failures of their own.
VERIFY_ARGS = ("--verify-k", "40", "--verify-retention-k", "79", "--verify-batch-size", "4")


def synth(coco, out, *extra):
    base = ("--max-pixels", "1000000", "--image-method", "blur", "--policy", "all")
    return main(synth_args(coco, out, *base, "--contact-sheet", "0", *extra))


def read_status(out):
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


def read_meta(out):
    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    return {s["__key__"]: json.loads(s["json"]) for s in wds.WebDataset(urls, shardshuffle=False)}


@pytest.fixture(scope="module")
def recorded(coco, clip, tmp_path_factory):
    out = tmp_path_factory.mktemp("record")
    assert synth(coco, out, "--verify", "--verify-model", clip, *VERIFY_ARGS) == 0
    return out


@pytest.fixture(scope="module")
def plain(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    assert synth(coco, out) == 0
    return out


@pytest.mark.slow
def test_verify_records_a_verdict_in_every_sample_and_drops_none(recorded, plain, clip):
    assert read_status(recorded) == read_status(plain)  # record mode drops nothing
    meta = read_meta(recorded)
    assert meta and set(meta) == set(read_meta(plain))
    for m in meta.values():
        v = m["verify"]
        assert v["model"] == clip and v["k"] == 40 and v["retention_k"] == 79
        assert [r["class"] for r in v["removal"]] == m["plan"]["removed"]
        assert [r["class"] for r in v["retention"]] == m["plan"]["kept"]
        assert v["passed"] == (not v["failed"])
        for r in v["removal"]:
            assert 1 <= r["rank_before"] <= 80 and r["removed"] == (r["rank_after"] > 40)
    assert "verify" not in next(iter(read_meta(plain).values()))
    manifest = json.loads((recorded / "manifest.json").read_text())
    summary = manifest["verify"]
    assert summary["written_checked"] == len(meta) and summary["dropped"] == {}
    assert summary["written_passed"] == sum(m["verify"]["passed"] for m in meta.values())
    assert manifest["config"]["verify"]["mode"] == "record"
    assert "verify" not in json.loads((plain / "manifest.json").read_text())


@pytest.mark.slow
def test_filter_writes_exactly_the_passing_samples(coco, clip, recorded, tmp_path):
    out = tmp_path / "filter"
    assert synth(coco, out, "--filter", "--verify-model", clip, *VERIFY_ARGS) == 0
    verdicts = {k: m["verify"] for k, m in read_meta(recorded).items()}
    passing = {k for k, v in verdicts.items() if v["passed"]}
    assert passing and len(passing) < len(verdicts), "want both passes and failures here"
    written = read_meta(out)
    assert set(written) == passing and all(m["verify"]["passed"] for m in written.values())
    rows = read_status(out)
    dropped = {r["key"]: r for r in rows if r["key"] and r["status"] == "failed"}
    for key, verdict in verdicts.items():
        if key not in passing:
            assert dropped[key]["reason"] == verdict["failed"][0]
            assert dropped[key]["reason"].startswith("verify-") and dropped[key]["detail"]
    verify_dropped = {k for k, r in dropped.items() if r["reason"].startswith("verify-")}
    assert verify_dropped == set(verdicts) - passing
    assert {REMOVAL, TEXT} <= {dropped[k]["reason"] for k in verify_dropped}
    manifest = json.loads((out / "manifest.json").read_text())
    planned = sum(1 for r in rows if r["key"])
    assert manifest["items"] == planned == len(written) + len(dropped)  # nothing lost
    assert sum(manifest["verify"]["dropped"].values()) == len(verdicts) - len(passing)


@pytest.mark.slow
def test_yaml_config_takes_the_verify_keys(coco, clip, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"verify: true\nverify_model: {clip}\nverify_k: 2\nverify_text: false\n")
    out = tmp_path / "out"
    assert synth(coco, out, "--config", str(config)) == 0
    verify = json.loads((out / "manifest.json").read_text())["config"]["verify"]
    assert (verify["mode"], verify["k"], verify["text_check"]) == ("record", 2, False)
    assert all(m["verify"]["text"] is None for m in read_meta(out).values())


def test_verify_refuses_a_vocabulary_without_the_dataset_classes(coco, tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("person, man\n")
    (tmp_path / "clip").mkdir()  # a local model that is here (the run checks that first)
    clip = f"hf-clip:{tmp_path / 'clip'}"  # but never loaded: the vocabulary is refused first
    assert (
        synth(
            coco, tmp_path / "out", "--verify", "--vocabulary", str(vocab), "--verify-model", clip
        )
        == 2
    )
    assert "not in the vocabulary" in capsys.readouterr().err
