"""Every loader opens a run folder as docs/training.md's "Load the shards" shows it: our
``counterfactual.load.webdataset`` in DataLoaders with more workers than shards (webdataset
0.2.x here; 1.x with an interpreter named by ``COUNTERFACTUAL_WDS1_PYTHON``), Ray Data, wids,
Hugging Face datasets and open_clip's trainer with ``--workers 2``. One real ``counterfactual
synth`` process writes the folder once per module: 6 shards of 3 images, the first empty
(three bad images), two of one sample, so some DataLoader workers get no shard and some fewer
samples than a batch."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from bad_coco import make_bad_coco, synth_args
from tiny_open_clip import tiny_open_clip_dir

from counterfactual.load import shard_sizes, shard_urls
from counterfactual.shards.indexes import LOADER_WORKERS, few_shards_note
from counterfactual.synth.run import read_status

REPO = Path(__file__).resolve().parents[1]
ARGS = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0",
        "--max-pixels", "1000000", "--policy", "spurious", "--pairs")  # fmt: skip
WDS1 = os.environ.get("COUNTERFACTUAL_WDS1_PYTHON")  # a Python with webdataset 1.x


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", HF_DATASETS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _python(python: str, script: str, cwd: Path, timeout: int = 120) -> str:
    """Run ``script`` with ``python`` in ``cwd``; its stdout (it must exit 0)."""
    done = subprocess.run(
        [python, "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(folder, synth's CompletedProcess)``: the run made as a user makes it."""
    root = tmp_path_factory.mktemp("loaders")
    files = make_bad_coco(root / "coco", n=18, size=(96, 72))
    argv = synth_args(files, root / "out", *ARGS)
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *argv], cwd=root, env=_env(),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "out", done


@pytest.fixture(scope="module")
def out(run) -> Path:
    return run[0]


@pytest.fixture(scope="module")
def written(out) -> list[str]:
    """The keys of the samples the run wrote, sorted, from ``status.jsonl``."""
    return sorted(s.key for s in read_status(out) if s.status == "written")


def _tar_keys(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {m.name.split(".", 1)[0] for m in tar.getmembers()}


# --- the shard list and the run's note -----------------------------------------------------------


def test_the_run_is_the_one_the_module_needs(out, written):
    sizes = shard_sizes(out)
    assert len(sizes) == 6 and sizes["shard-000000.tar"] == 0
    assert sum(sizes.values()) == len(written) and min(n for n in sizes.values() if n) == 1


def test_shard_urls_are_the_shards_that_hold_samples(out, written):
    urls = shard_urls(out)
    assert urls == sorted(urls) and all(Path(u).is_absolute() for u in urls)
    assert [Path(u).name for u in urls] == [
        name for name, n in sorted(shard_sizes(out).items()) if n > 0
    ]
    assert sorted(k for u in urls for k in _tar_keys(Path(u))) == written


def test_shard_urls_of_a_folder_that_is_no_run(tmp_path):
    (tmp_path / "shard-000000.tar").write_bytes(b"")
    with pytest.raises(ValueError, match=r"has no sizes\.json: not a counterfactual run folder"):
        shard_urls(tmp_path)
    (tmp_path / "sizes.json").write_text('{"shard-000000.tar": 0}')
    with pytest.raises(ValueError, match=r"no shard of .* holds a sample \(1 empty\)"):
        shard_urls(tmp_path)
    (tmp_path / "sizes.json").write_text('["shard-000000.tar"]')
    with pytest.raises(ValueError, match="not an object of shard names and sample counts"):
        shard_urls(tmp_path)


@pytest.mark.parametrize(
    ("counts", "noted"),
    [
        ([0], False),  # no sample: the run says so already
        ([3], True),
        ([0, 5, 0], True),
        ([1] * (LOADER_WORKERS - 1) + [0], True),
        ([1] * LOADER_WORKERS, False),
        ([1] * (LOADER_WORKERS + 3), False),
    ],
)
def test_few_shards_note_boundary(counts, noted):
    sizes = {f"shard-{i:06d}.tar": n for i, n in enumerate(counts)}
    note = few_shards_note(sizes, "out/x")
    assert (note is not None) == noted
    if note is not None:
        held = sum(1 for n in counts if n)
        assert note.startswith(f"note: {held} shard") and "\n" not in note
        assert "counterfactual.load.webdataset('out/x')" in note


def test_synth_notes_fewer_shards_than_loader_workers(run):
    out, done = run
    lines = done.stderr.strip().splitlines()
    last = lines[lines.index("next steps:") - 1]  # the note, then the next steps, last
    assert last.startswith("note: 5 shards hold samples, fewer than the 8 DataLoader workers")
    assert f"counterfactual.load.webdataset({str(out)!r})" in last
    assert "note:" not in done.stdout


# --- webdataset in DataLoaders --------------------------------------------------------------------

_DATALOADER = """
import json, torch, webdataset as wds
from counterfactual.load import webdataset
ds = webdataset({out!r}).decode("pil").to_tuple("__key__", "jpg", "txt", "json")
keys = []
for key, image, caption, meta in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=8):
    assert image.size == (96, 72) and caption == meta["caption"], (key, caption)
    keys.append(key)
batches = webdataset({out!r}).to_tuple("__key__").batched(2, partial=False).with_epoch(3)
sizes = [len(b[0]) for b in torch.utils.data.DataLoader(batches, batch_size=None, num_workers=8)]
print(json.dumps({{"version": wds.__version__, "keys": keys, "batches": sizes}}))
"""

INTERPRETERS = [
    pytest.param(sys.executable, id="this-venv"),
    pytest.param(
        WDS1, id="webdataset-1.x",
        marks=pytest.mark.skipif(not WDS1, reason="COUNTERFACTUAL_WDS1_PYTHON is not set"),
    ),
]  # fmt: skip


@pytest.mark.parametrize("python", INTERPRETERS)
def test_webdataset_with_more_workers_than_shards(python, out, written, tmp_path):
    """8 workers, 5 shards with samples: every sample once; with ``with_epoch`` and whole
    batches, workers with no shard or one of a single sample end their epoch (0.2.x's own
    ``with_epoch`` loops forever there, 1.x's plain ``WebDataset`` raises "No samples found")."""
    found = json.loads(_python(python, _DATALOADER.format(out=str(out)), tmp_path))
    assert sorted(found["keys"]) == written
    assert found["version"].startswith("1." if python == WDS1 else "0.2.")
    # the shards of 3 samples give one whole batch a pass, 3 passes; those of 1 give none
    whole = sum(1 for n in shard_sizes(out).values() if n >= 2)
    assert found["batches"] == [2] * (3 * whole)


# --- Ray Data, wids, Hugging Face datasets ----------------------------------------------------------


@pytest.mark.slow
def test_ray_data_reads_the_run(out, written, tmp_path):
    """Ours, and Ray's own call with the extension filter; the plain folder fails."""
    script = f"""
import json, ray
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
from counterfactual.pipelines.load import ray_dataset
ours = ray_dataset({str(out)!r}).take_all()
plain = ray.data.read_webdataset({str(out)!r}, file_extensions=["tar"]).take_all()
try:
    ray.data.read_webdataset({str(out)!r}).count()
    folder = "read"
except Exception as err:
    folder = type(err).__name__
row = ours[0]
print(json.dumps({{"ours": [r["__key__"] for r in ours], "plain": [r["__key__"] for r in plain],
                  "folder": folder, "shape": list(row["jpg"].shape),
                  "caption": row["txt"] == row["json"]["caption"]}}))
"""
    found = json.loads(_python(sys.executable, script, tmp_path, timeout=300).splitlines()[-1])
    assert sorted(found["ours"]) == sorted(found["plain"]) == written
    assert found["folder"] != "read" and found["shape"] == [72, 96, 3] and found["caption"]


def test_wids_reads_the_shard_index(out, written, tmp_path):
    """``wids.ShardListDataset`` on the run's ``shardindex.json``: each sample by index, and
    a DataLoader of 2 workers with wids' sampler gives every sample once."""
    pytest.importorskip("wids")
    script = f"""
import json, torch, warnings, wids
warnings.simplefilter("ignore")
ds = wids.ShardListDataset({str(out / "shardindex.json")!r})
first = ds[0]
loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=wids.ShardedSampler(ds),
                                     num_workers=2, collate_fn=lambda s: s["__key__"])
print(json.dumps({{"n": len(ds), "keys": [ds[i]["__key__"] for i in range(len(ds))],
                  "loaded": list(loader), "size": list(first[".jpg"].size),
                  "caption": first[".txt"] == first[".json"]["caption"]}}))
"""
    found = json.loads(_python(sys.executable, script, tmp_path))
    assert found["n"] == len(written) and sorted(found["keys"]) == written
    assert sorted(found["loaded"]) == written
    assert found["size"] == [96, 72] and found["caption"]


def test_hf_datasets_loads_the_folder(out, written, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert sorted(ds["__key__"]) == written
    assert ds[0]["jpg"].size == (96, 72) and ds[0]["txt"] == ds[0]["json"]["caption"]


# --- open_clip's trainer --------------------------------------------------------------------------


@pytest.mark.slow
def test_open_clip_trains_with_two_workers_on_the_mix_flags(out, tmp_path):
    """The recipe of docs/training.md: ``mix --unpair`` then open_clip's trainer on the printed flags,
    ``--workers 2`` for a few steps on CPU, on 5+5 small shards (two of one sample)."""
    pytest.importorskip("open_clip_train")
    originals = tmp_path / "originals"
    argv = ["mix", "--unpair", str(originals), "--synthetic", str(out), "--ratio", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *argv], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    flags = shlex.split(printed[printed.index("open_clip flags:") + 1])
    assert "--dataset-resampled" in flags
    assert int(flags[flags.index("--train-num-samples") + 1]) > 8
    logs, model = tmp_path / "logs", tiny_open_clip_dir(tmp_path / "model")
    command = [sys.executable, "-m", "open_clip_train.main", *flags]
    command += ["--dataset-type", "webdataset", "--model", model, "--device", "cpu"]
    command += ["--precision", "fp32", "--batch-size", "2", "--workers", "2", "--epochs", "1"]
    command += ["--lr", "1e-5", "--warmup", "1", "--seed", "0", "--log-every-n-steps", "1"]
    command += ["--report-to", "", "--logs", str(logs), "--name", "w2", "--save-frequency", "1"]
    command += ["--train-num-samples", "8"]  # four steps of two (the last value wins)
    done = subprocess.run(
        command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    log = (logs / "w2" / "out.log").read_text() if (logs / "w2" / "out.log").exists() else ""
    assert done.returncode == 0, done.stderr[-3000:]
    steps = re.findall(r"Train Epoch: 0 \[\s*(\d+)/8 ", log)
    assert [int(n) for n in steps] == [2, 4, 6, 8], log[-3000:]
    assert (logs / "w2" / "checkpoints" / "epoch_1.pt").stat().st_size > 0
    assert "Handling webdataset error" not in log + done.stderr
