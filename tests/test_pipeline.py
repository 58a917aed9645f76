"""The Ray pipeline end to end through the command a user types, on one Ray instance shared by
the module: the same bytes as the in-process runner, every input accounted for, resume after a
SIGKILL of the driver or of a worker, the model stage as an actor pool, YAML configs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from bad_coco import make_bad_coco, synth_args
from PIL import Image
from shard_files import run_outputs

from counterfactual.cli import main

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"), n=14)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Enough work that a kill lands mid-run (16 shards of 4; the kills land after 2 and 8,
    killing_run.py times them): every image has a removable class."""
    return make_bad_coco(tmp_path_factory.mktemp("big"), n=64, size=(320, 240))


def args(files, out, *extra):
    return synth_args(files, out, "--max-pixels", "1000000", *extra)


BLUR = ("--image-method", "blur", "--policy", "all", "--images-per-shard", "3")
"""The runs the shared ``local_run``/``ray_run`` make (a rerun with them resumes)."""


@pytest.fixture(scope="module")
def local_run(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    assert main(args(coco, out, *BLUR, "--contact-sheet", "0")) == 0
    return out


@pytest.fixture(scope="module")
def ray_run(coco, module_ray, tmp_path_factory):
    out = tmp_path_factory.mktemp("ray")
    assert main(args(coco, out, *BLUR, "--runner", "ray", "--contact-sheet", "2")) == 0
    return out


def test_ray_writes_the_same_bytes_as_the_in_process_runner(ray_run, local_run):
    ours, theirs = run_outputs(ray_run), run_outputs(local_run)
    assert sorted(ours) == sorted(theirs) and len(ours) > 4
    for name in ours:
        assert ours[name] == theirs[name], name


def test_every_input_ends_in_a_shard_or_a_reasoned_status_row(ray_run):
    rows = [json.loads(line) for line in (ray_run / "status.jsonl").read_text().splitlines()]
    assert {r["image_id"] for r in rows} == {str(i) for i in range(1, 15)}
    reasons = {(r["image_id"], r["status"], r["reason"]) for r in rows}
    for expected in [
        ("10", "skipped", "no-removable-class"),  # its boxes lie off the image
        ("1", "failed", "decode-error"),
        ("2", "failed", "missing-file"),
        ("3", "failed", "decode-error"),
        ("7", "failed", "image-too-large"),
        ("8", "failed", "unsafe-path"),
        ("9", "failed", "bad-annotation"),
        ("12", "failed", "size-mismatch"),
    ]:
        assert expected in reasons
    for good in ("4", "5", "6", "11", "13", "14"):  # CMYK, gray, EXIF-rotated, odd Unicode
        assert (good, "written", None) in reasons
    assert all(r["reason"] for r in rows if r["status"] != "written")
    keys = [r["key"] for r in rows if r["status"] == "written"]
    samples = list(
        wds.WebDataset(sorted(str(p) for p in ray_run.glob("*.tar")), shardshuffle=False)
    )
    assert [s["__key__"] for s in samples] == keys  # shard order is status order
    manifest = json.loads((ray_run / "manifest.json").read_text())
    assert manifest["runner"] == "ray" and manifest["samples"] == len(keys)
    assert manifest["ray"]["stages"] == [["rewrite", "decode", "edit", "encode"]]
    assert manifest["ray"]["cpus"] == 2 and manifest["versions"]["ray"] == ray.__version__
    assert "git_revision" in manifest and manifest["config"]["image"]["method"] == "blur"
    stats = [json.loads(p.read_text()) for p in sorted(ray_run.glob("*_stats.json"))]
    assert [s["images"] for s in stats[:-1]] == [3] * (len(stats) - 1)  # fixed images per shard
    assert manifest["items_per_node"] and sum(manifest["items_per_node"].values()) == sum(
        s["items"] for s in stats
    )
    assert (ray_run / "contact_sheet.png").exists()


def test_shards_load_the_way_clip_training_reads_them(ray_run):
    """open_clip's webdataset path: decode to PIL RGB, rename jpg->image and txt->text."""
    urls = sorted(str(p) for p in ray_run.glob("shard-*.tar"))
    pipeline = (
        wds.WebDataset(urls, shardshuffle=False)
        .decode("pilrgb")
        .rename(image="jpg;png;jpeg;webp", text="txt")
        .map_dict(image=lambda im: np.asarray(im.resize((32, 32)), np.float32) / 255)
        .to_tuple("image", "text")
    )
    pairs = list(pipeline)
    assert pairs and all(im.shape == (32, 32, 3) and isinstance(t, str) for im, t in pairs)


def test_rerun_keeps_finished_shards_and_refuses_another_config(ray_run, coco, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in ray_run.glob("shard-*")}
    assert main(args(coco, ray_run, *BLUR, "--runner", "ray", "--contact-sheet", "0")) == 0
    assert {p.name: p.stat().st_mtime_ns for p in ray_run.glob("shard-*")} == before
    assert "from an earlier run" in capsys.readouterr().out
    code = main(args(coco, ray_run, "--image-method", "zero", "--images-per-shard", "3"))
    assert code == 2 and "different config" in capsys.readouterr().err


def test_a_resumed_run_starts_no_more_workers_than_shards_left(ray_run, coco, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(ray_run, out)
    lost = sorted(out.glob("shard-000001*"))
    assert lost
    for path in lost:
        path.unlink()
    assert main(args(coco, out, *BLUR, "--runner", "ray", "--contact-sheet", "2")) == 0
    assert sorted(out.glob("shard-000001*")) == lost
    layout = json.loads((out / "manifest.json").read_text())["ray"]["layout"]
    assert layout["workers"] == 1, layout  # the Ray has 2 CPUs: 2 workers for a fresh run
    assert layout["rule"].endswith("; at most the 1 shard left to make"), layout["rule"]


KILLING_RUN = Path(__file__).with_name("killing_run.py")
KILL_ARGS = ("--image-method", "blur", "--images-per-shard", "4", "--batch-size", "2")


def _run_and_kill(cluster, files, out, target, n):
    """Run the command in another process joined to the test's Ray, with a SIGKILL of
    ``target`` at a fixed point (see killing_run.py); return the process's exit code once that
    run's actors are gone too: Ray ends a job's actors only when it sees its driver dead, and
    until then a shard worker may still commit the shard it is in."""
    import ray

    before = set(_named_actors(ray))
    env = {**os.environ, "RAY_ADDRESS": cluster["address"]}
    extra = (*KILL_ARGS, "--runner", "ray", "--contact-sheet", "0")
    cmd = [sys.executable, str(KILLING_RUN), target, str(n), *args(files, out, *extra)]
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as f:
        code = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=240)
    assert code.returncode != 1, log.read_text()[-3000:]
    deadline = time.monotonic() + 60
    while left := set(_named_actors(ray)) - before:  # the run's board and workers are named
        assert time.monotonic() < deadline, f"the killed run's actors are still alive: {left}"
        time.sleep(0.2)
    return code.returncode


def _named_actors(ray) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]


@pytest.fixture(scope="module")
def big_clean(big, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    extra = ("--image-method", "blur", "--images-per-shard", "4", "--contact-sheet", "0")
    assert main(args(big, out, *extra)) == 0
    return out


def _committed(out):
    """The committed shards (tar and stats file: a tar without its stats file is unfinished,
    as when the kill lands while the stats file is written) by their tar's mtime."""
    return {
        p.name: p.stat().st_mtime_ns
        for p in out.glob("shard-*.tar")
        if p.with_name(p.stem + "_stats.json").exists()
    }


def test_resume_after_sigkill_of_the_driver(module_ray, big, big_clean, tmp_path):
    out = tmp_path / "out"
    total = len(list(big_clean.glob("shard-*.tar")))
    assert _run_and_kill(module_ray, big, out, "driver", 2) == -signal.SIGKILL
    done = _committed(out)
    assert 2 <= len(done) < total, "the kill did not land mid-run"
    # (the kill landed while a worker was inside a shard; its actors die with the driver, and
    # whether that shard's temporary file is still there depends on how fast they die)
    assert not (out / "status.jsonl").exists()
    assert main(args(big, out, *KILL_ARGS, "--runner", "ray", "--contact-sheet", "0")) == 0
    assert {k: v for k, v in _committed(out).items() if k in done} == done  # not redone
    assert run_outputs(out) == run_outputs(big_clean)  # nothing dropped, nothing twice
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards_resumed"] == len(done) and not list(out.glob("*.tmp"))


def test_a_killed_worker_loses_nothing(module_ray, big, big_clean, tmp_path):
    out = tmp_path / "out"
    # The lost worker's shard goes to the other worker, so the run finishes by itself.
    assert _run_and_kill(module_ray, big, out, "worker", 8) == 0
    assert "killed worker" in (tmp_path / "out.log").read_text()
    assert run_outputs(out) == run_outputs(big_clean)


def _samples(out):
    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False).decode("rgb8"))


def test_model_stage_runs_as_an_actor_pool(coco, module_ray, tmp_path):
    """The diffusion stage on CPU with a tiny pipeline saved to disk: its own actor pool between
    a CPU stage that decodes and one that encodes, and the same bytes as in-process."""
    from counterfactual.testing import build_tiny_inpaint_pipeline

    sd = build_tiny_inpaint_pipeline(tmp_path / "sd")
    extra = [
        "--limit",
        "14",
        "--inpaint-backend",
        "diffusers",
        "--inpaint-model",
        str(sd),
        "--steps",
        "2",
        "--resolution",
        "64",
        "--inpaint-batch-size",
        "2",
        "--contact-sheet",
        "0",
    ]
    ray_only = ("--runner", "ray", "--model-actors", "1")  # its own pool, even on CPU
    assert main(args(coco, tmp_path / "ray", *extra, *ray_only)) == 0
    assert main(args(coco, tmp_path / "local", *extra)) == 0
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert manifest["ray"]["stages"] == [["rewrite", "decode"], ["edit"], ["encode"]]
    assert manifest["ray"]["layout"]["model_actors"] == [0, 1, 0]
    assert manifest["samples"] > 0
    # Same items, keys, captions and statuses. Pixels agree up to float noise: torch sums in
    # another order with one thread per actor than with all cores in one process.
    ours, theirs = run_outputs(tmp_path / "ray"), run_outputs(tmp_path / "local")
    assert ours["status.jsonl"] == theirs["status.jsonl"]

    def stats(outputs):  # the tars differ by that noise, so do their sizes and hashes
        return {
            k: {f: x for f, x in v.items() if f not in ("size", "sha256")}
            for k, v in outputs.items()
            if k.endswith(".json")
        }

    assert stats(ours) == stats(theirs)
    a = _samples(tmp_path / "ray")
    b = _samples(tmp_path / "local")
    assert [(s["__key__"], s["txt"], s["json"]) for s in a] == [
        (s["__key__"], s["txt"], s["json"]) for s in b
    ]
    for x, y in zip(a, b, strict=True):
        diff = np.abs(np.asarray(x["jpg"], int) - np.asarray(y["jpg"], int))
        assert diff.mean() < 2, (x["__key__"], diff.mean())
    sample = next(
        iter(
            wds.WebDataset(str(tmp_path / "ray" / "shard-000000.tar"), shardshuffle=False).decode(
                "pil"
            )
        )
    )
    assert sample["json"]["image_method"]["backend"] == "diffusers"
    assert isinstance(sample["jpg"], Image.Image)


def test_yaml_config_with_command_line_overrides(coco, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("image_method: zero\ntext_method: prompt\nimages_per_shard: 2\nseed: 3\n")
    out = tmp_path / "out"
    assert (
        main([*args(coco, out, "--contact-sheet", "0"), "--config", str(config), "--seed", "4"])
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["image"]["method"] == "zero"
    assert manifest["config"]["text"]["method"] == "prompt"
    assert manifest["config"]["images_per_shard"] == 2 and manifest["config"]["seed"] == 4
    config.write_text("image_methd: zero\n")
    assert main([*args(coco, tmp_path / "o2"), "--config", str(config)]) == 2
    assert "image_methd" in capsys.readouterr().err
    config.write_text("image_method: paint\n")
    assert main([*args(coco, tmp_path / "o3"), "--config", str(config)]) == 2
    assert "paint" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["demo", "coco", "flickr30k", "wds", "parquet", "csv", "files"])
def test_shipped_configs_are_valid(name):
    from counterfactual.cli import build_parser
    from counterfactual.cli.config import load_config
    from counterfactual.cli.synth import build_config, build_runtime

    path = (
        Path(__file__).parent.parent / "counterfactual" / "pipelines" / "configs" / f"{name}.yaml"
    )
    sub = build_parser().parse_args(["synth"]).__dict__["_subcommands"]["synth"]
    values = load_config(path, sub)
    # the demo runs in-process (`make synth RUNNER=ray` shows Ray); the real configs on Ray
    assert values["dataset"] == name and values["runner"] == ("local" if name == "demo" else "ray")
    sub.set_defaults(**values)
    args = sub.parse_args(["--out", "x"])
    config = build_config(args)
    if name in (
        "wds",
        "parquet",
        "csv",
        "files",
    ):  # no boxes: the detector, caption-aware selection
        assert config.detect is not None and build_runtime(args).device == "cuda"
        assert config.text.skip_unchanged
    else:
        assert config.detect is None and not config.text.skip_unchanged


@pytest.mark.parametrize(
    ("image", "text", "device", "expected"),
    [
        ("blur", "np-removal", "cpu", [("ShardWorker", ("rewrite", "decode", "edit", "encode"))]),
        (
            "diffusers",
            "np-removal",
            "cuda",
            [
                ("ShardWorker", ("rewrite", "decode")),
                ("Inpaint", ("edit",)),
                ("ShardWorker", ("encode",)),
            ],
        ),
        (
            "blur",
            "captioner",
            "cuda",
            [
                ("ShardWorker", ("decode", "edit")),
                ("Caption", ("rewrite",)),
                ("ShardWorker", ("encode",)),
            ],
        ),
        (
            "diffusers",
            "captioner",
            "cuda",
            [
                ("ShardWorker", ("decode",)),
                ("Inpaint", ("edit",)),
                ("Caption", ("rewrite",)),
                ("ShardWorker", ("encode",)),
            ],
        ),
        (
            "diffusers",
            "detector",
            "cuda",
            [
                ("ShardWorker", ("decode",)),
                ("Detect", ("detect",)),
                ("ShardWorker", ("select", "rewrite")),
                ("Inpaint", ("edit",)),
                ("ShardWorker", ("encode",)),
            ],
        ),
    ],
)
def test_stages_and_their_resources(image, text, device, expected):
    """Which steps run where, and how a cluster is shared out: GPU model steps on actor pools
    of their own, everything else in the shard workers; an impossible setup is refused before
    anything starts, naming the stage and the fix."""
    from counterfactual.image import ImageConfig
    from counterfactual.method.detect import DetectConfig
    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import layout_actors
    from counterfactual.synth.layout import Cluster
    from counterfactual.synth.plan import Runtime, SynthConfig
    from counterfactual.synth.staging import SetupError, plan_stages
    from counterfactual.text import TextConfig

    method = ("inpaint", "diffusers") if image == "diffusers" else (image, "opencv")
    detect = DetectConfig() if text == "detector" else None
    config = SynthConfig(
        image=ImageConfig(method=method[0], backend=method[1]),
        text=TextConfig(method="np-removal" if detect else text),
        detect=detect,
    )
    runtime = Runtime(device=device, inpaint_batch_size=4, detect_batch_size=4)
    stages = plan_stages(config, runtime)
    options = RayOptions(gpus_per_actor=0.5)
    layout = layout_actors(stages, options, Cluster.single(16, 4))
    got = [
        (s.resources.stage if n else "ShardWorker", s.steps)
        for s, n in zip(stages, layout.model_actors, strict=True)
    ]
    assert got == expected
    heavy = any(s.resources.heavy for s in stages if s.uses_model)
    for stage, n, gpus in zip(stages, layout.model_actors, layout.gpus, strict=True):
        if not stage.uses_model:
            assert (n, gpus) == (0, 0.0)
        elif stage.resources.heavy or not heavy:  # half a GPU each, as many as fit
            assert gpus == 0.5 and n >= 7 // sum(s.uses_model for s in stages)
        else:  # a light stage beside the inpainter: tenth-GPU actors, as many as its cost
            # asks against the inpainter's (tests/test_layout.py checks that rule), 1 to 1 a GPU
            assert gpus == 0.1 and 1 <= n <= 4, (stage.resources.stage, n, gpus)
    assert sum(n * g for n, g in zip(layout.model_actors, layout.gpus, strict=True)) <= 4
    assert layout.workers == 16 - sum(layout.model_actors)  # the CPUs left, one per actor
    if any(s.uses_model for s in stages):
        with pytest.raises(
            SetupError, match=r"asks for 1 actor x 0\.[15] GPU .* no GPU.*--device cpu"
        ):
            layout_actors(stages, options, Cluster.single(16))
        with pytest.raises(SetupError, match="leave none for a shard worker"):
            layout_actors(stages, RayOptions(model_actors=8), Cluster.single(8, 8))
    with pytest.raises(ValueError, match="gpus_per_actor"):
        RayOptions(gpus_per_actor=0)
