"""Settings split from the runtime: the fingerprint holds only the options that decide the output
and differ from their defaults, the manifest still records the whole config as before, and runs
made before the split still resume.

``format2_configs.json`` was written by the code before the split (commit cdbd644) for the
configs below: each one's ``run.json`` fingerprint and its ``manifest.json`` config."""

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
from test_stages import records

from counterfactual.cli import build_parser
from counterfactual.cli.synth import build_config, build_runtime
from counterfactual.image import DiffusersConfig, ImageConfig, make_editor
from counterfactual.method.detect import DetectConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.shards.names import RUN_FILE
from counterfactual.synth import steps as stages
from counterfactual.synth.plan import Runtime, SynthConfig, fingerprint_of
from counterfactual.synth.runner import run_local
from counterfactual.text import TextConfig

OLD = json.loads((Path(__file__).parent / "format2_configs.json").read_text())["cases"]
ROOT = ["--dataset", "coco", "--root", "/tmp/r"]
CLI = {
    "cli-coco-defaults": ROOT,
    "cli-blur-prompt": [
        *ROOT,
        *("--image-method", "blur", "--text-method", "prompt", "--captions-per-image", "all"),
        *("--seed", "3", "--batch-size", "4"),
    ],
    "cli-verify": [
        *ROOT,
        *("--verify", "--verify-k", "3", "--device", "cuda", "--verify-batch-size", "7"),
    ],
    "cli-wds-detect": [
        *("--dataset", "wds", "--root", "/tmp/r", "--detector-model", "owl"),
        *("--detect-threshold", "0.3"),
    ],
    "cli-repair": [
        *ROOT,
        *("--repair-captions", "--vocabulary", "words.txt", "--skip-unchanged-captions"),
    ],
    "cli-diffusers": [
        *ROOT,
        *("--inpaint-backend", "diffusers", "--candidates", "3", "--dtype", "float16"),
        *("--device", "cuda", "--steps", "20", "--inpaint-batch-size", "4"),
    ],
    "cli-lama": [
        *ROOT,
        *("--inpaint-backend", "lama", "--inpaint-model", "big-lama.pt"),
        *("--lama-max-side", "512"),
    ],
    "cli-selection": [
        *ROOT,
        *("--policy", "spurious", "--alpha1", "0.3", "--mask-source", "segmentation"),
        *("--dilate", "4", "--images-per-shard", "10", "--max-pixels", "1000", "--filter"),
    ],
}
LIBRARY = {
    "library-defaults": (SynthConfig(), Runtime()),
    "library-mixed": (
        SynthConfig(
            image=ImageConfig(method="zero"),
            text=TextConfig(method="captioner", model="blip"),
            verify=VerifyConfig(mode="record"),
            jpeg_quality=90,
        ),
        Runtime(device="cuda", inpaint_batch_size=3, verify_batch_size=7, batch_size=5),
    ),
}
RETIRED_SD2 = "stabilityai/stable-diffusion-2-inpainting"
SAME = {"library-defaults": "cli-coco-defaults", "cli-coco-defaults": "library-defaults"}
"""Cases that are one config (the CLI's defaults are the library's)."""


def now(name: str) -> tuple[SynthConfig, Runtime]:
    """The case's config and runtime as this code builds them."""
    if name in LIBRARY:
        return LIBRARY[name]
    args = build_parser().parse_args(["synth", "--out", "/tmp/x", *CLI[name]])
    return build_config(args), build_runtime(args)


def then(name: str) -> SynthConfig:
    """The case's config as this code builds it, with caption repair as it was by default when
    the case was recorded (off): an old np-removal record without ``repair`` wrote the paper's
    exact captions, which today's default (repair on) does not."""
    config, _ = now(name)
    if name != "cli-repair" and config.text.method == "np-removal":
        config = replace(config, text=replace(config.text, repair=False))
    return config


def test_every_case_is_covered():
    assert set(OLD) == set(CLI) | set(LIBRARY)


@pytest.mark.parametrize("name", sorted(OLD))
def test_the_manifest_records_the_config_as_before(name):
    config, runtime = now(name)
    recorded = config.record(runtime)
    # the default inpainting model is now the community mirror of the deleted Stability repo
    old = json.dumps(OLD[name]["recorded"]).replace(RETIRED_SD2, DiffusersConfig().model)
    expected = json.loads(old)
    expected["text"]["repair"] = True  # caption repair is the default since issue 23
    assert json.dumps(recorded) == json.dumps(expected)  # same keys, same order


@pytest.mark.parametrize("name", sorted(OLD))
def test_an_old_fingerprint_is_recognised_and_only_by_its_config(name):
    old = OLD[name]["fingerprint"]
    assert old["format"] == 2
    for other in OLD:
        same = fingerprint_of(old["config"]) == then(other).fingerprint()
        assert same == (other in (name, SAME.get(name))), other
    # today's default would write repaired captions: such a rerun is another config
    config, _ = now(name)
    if then(name) != config:
        assert fingerprint_of(old["config"]) != config.fingerprint()


def test_the_fingerprint_holds_only_what_differs_from_the_defaults():
    # np-removal always names caption repair, whose default changed (see fingerprint_of)
    text = {"repair": True}
    assert SynthConfig().fingerprint() == {"selection": {}, "mask": {}, "image": {}, "text": text}
    # run.json holds the fingerprint itself: read back, it is the same (a rerun resumes)
    for config in (SynthConfig(), SynthConfig(text=TextConfig(repair=False))):
        assert fingerprint_of(config.fingerprint()) == config.fingerprint()
    config, runtime = now("cli-diffusers")
    assert config.fingerprint()["image"] == {"backend": "diffusers", "steps": 20, "candidates": 3}
    wds, _ = now("cli-wds-detect")
    assert wds.fingerprint()["detect"] == {"model": "owl", "score_threshold": 0.3}
    assert wds.fingerprint()["text"] == {"skip_unchanged": True, "repair": True}
    # a detector at its defaults is still a detector
    assert SynthConfig(detect=DetectConfig()).fingerprint()["detect"] == {}
    # the runtime is nowhere in it, and the record and the fingerprint agree
    assert fingerprint_of(config.record(runtime)) == config.fingerprint()
    assert fingerprint_of(config.record(Runtime())) == config.fingerprint()


def test_an_option_added_with_its_default_leaves_old_fingerprints_as_they_were():
    """What the hand-kept pop-list did for repair, skip_unchanged, lama_max_side and
    candidates, the defaults do for any option: an old record that lacks a key reads as its
    default, but for caption repair, whose default changed: a record without it wrote the
    paper's exact captions."""
    old = OLD["cli-coco-defaults"]["fingerprint"]["config"]
    for part, key in (("text", "repair"), ("text", "skip_unchanged"), ("image", "candidates")):
        assert key not in old[part]
    paper = SynthConfig(text=TextConfig(repair=False))
    assert fingerprint_of(old) == paper.fingerprint() != SynthConfig().fingerprint()
    trimmed = {k: v for k, v in old.items() if k != "image"}
    assert fingerprint_of({**trimmed, "image": {}}) == paper.fingerprint()
    assert fingerprint_of({**old, "image": {"new_option": 1}}) != paper.fingerprint()
    # repair means nothing to the other text methods: their old records match as they were
    prompt = {**old, "text": {"method": "prompt"}}
    assert fingerprint_of(prompt) == SynthConfig(text=TextConfig(method="prompt")).fingerprint()


def test_a_run_recorded_with_the_deleted_sd2_id_keeps_its_fingerprint():
    """Runs recorded before the default moved to the community mirror resume (the same model
    under a new id); any other model is still a different config."""
    old = json.loads(json.dumps(OLD["cli-coco-defaults"]["fingerprint"]["config"]))
    assert fingerprint_of({**old, "image": {"model": RETIRED_SD2}}) == fingerprint_of(old)
    assert fingerprint_of({**old, "image": {"model": "x/y"}}) != fingerprint_of(old)


def test_the_vocabulary_is_one_setting():
    config = SynthConfig(vocabulary="words.txt")
    assert "vocabulary" not in {f.name for f in fields(TextConfig)}  # make_rewriter takes it
    assert config.record()["text"]["vocabulary"] == "words.txt"  # where the manifest kept it
    assert list(config.record()["text"])[:3] == ["method", "spacy_model", "vocabulary"]
    old = {**OLD["cli-coco-defaults"]["fingerprint"]["config"], "text": {"vocabulary": "words.txt"}}
    config = replace(config, text=TextConfig(repair=False))  # as recorded then
    assert fingerprint_of(old) == config.fingerprint()  # an old record with text.vocabulary


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 2.5}, "batch_size must be a whole number >= 1, got 2.5"),
        ({"inpaint_batch_size": 0}, "inpaint_batch_size must be a whole number >= 1, got 0"),
        ({"verify_batch_size": True}, "verify_batch_size must be a whole number >= 1"),
        ({"dtype": "float64"}, "dtype 'float64' is not one of float32, float16, bfloat16"),
        ({"device": " "}, "device must be a torch device name"),
    ],
)
def test_runtime_ranges(kwargs, message):
    with pytest.raises(ValueError) as err:
        Runtime(**kwargs)
    assert str(err.value).startswith(message)


def test_the_parts_hold_no_runtime_and_the_backends_get_it(monkeypatch):
    for part in (ImageConfig, TextConfig, VerifyConfig, DetectConfig):
        assert not {f.name for f in fields(part)} & {"device", "dtype", "batch_size"}, part
    with pytest.raises(TypeError):
        ImageConfig(method="blur", device="cuda")  # type: ignore[call-arg]
    seen: dict[str, object] = {}

    def editor(config: ImageConfig, **runtime: object):
        seen.update(runtime)
        return make_editor(config)

    monkeypatch.setattr(stages, "make_editor", editor)
    runtime = Runtime(device="cuda:1", dtype="float16", inpaint_batch_size=3)
    stages.Edit(SynthConfig(image=ImageConfig(method="blur")), runtime=runtime)
    assert seen == {"device": "cuda:1", "dtype": "float16", "batch_size": 3}


def _run(tmp_path: Path, config: SynthConfig, runtime: Runtime | None = None):
    return run_local(records(tmp_path, 4), tmp_path / "out", config, runtime=runtime)


def test_a_run_made_before_the_split_resumes(tmp_path):
    """A run whose run.json holds the fingerprint the code before the split wrote: the rerun
    keeps its shards, and one with another config is refused as before."""
    config, runtime = now("cli-blur-prompt")
    first = _run(tmp_path, config, runtime)
    run_file = tmp_path / "out" / RUN_FILE
    assert json.loads(run_file.read_text()) == {"format": 2, "config": config.fingerprint()}
    run_file.write_text(json.dumps(OLD["cli-blur-prompt"]["fingerprint"], indent=1))
    status = (tmp_path / "out" / "status.jsonl").read_text()
    again = _run(tmp_path, config, Runtime(batch_size=3))  # the runtime may change
    assert again.resumed == len(first.shards) == 1 and again.items_run == 0
    assert (tmp_path / "out" / "status.jsonl").read_text() == status
    assert json.loads(run_file.read_text()) == OLD["cli-blur-prompt"]["fingerprint"]  # kept
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["batch_size"] == 3 and len(manifest["runs"]) == 2
    other = SynthConfig(image=config.image, text=config.text, captions="all", seed=4)
    with pytest.raises(ValueError, match="different config"):
        _run(tmp_path, other, runtime)
