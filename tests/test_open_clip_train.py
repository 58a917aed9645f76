"""open_clip's own trainer on our shards, installed beside the project (the dev extra installs
``open_clip_torch[training]``): original jpg+txt shards and the shards of a real
``counterfactual synth`` run, mixed with the flags ``counterfactual mix`` prints (one brace
pattern and one weight per side), trained for two steps on CPU with a tiny model config (``tiny_open_clip``, read as a
``local-dir:`` model) and random weights."""

import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import webdataset as wds
from bad_coco import synth_args
from PIL import Image
from tiny_open_clip import tiny_open_clip_dir

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco
from counterfactual.train.mix import PLAN_VERSION

pytestmark = pytest.mark.slow

SHARDS, PER_SHARD = 2, 2  # 4 original samples: an epoch of 4 at ratio 0.1 is two steps of 2


def _jpeg(path: Path) -> bytes:
    buf = io.BytesIO()
    Image.open(path).convert("RGB").resize((32, 24)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """``orig/{00000..00001}.tar`` (jpg + txt, img2dataset's names, no stats files: counted from
    the tar) and a synth run's folder ``syn/``, both from one generated COCO-format set."""
    root = tmp_path_factory.mktemp("open_clip")
    files = generate_coco(root / "coco", 4, seed=3, size=(96, 72))
    captions = json.loads(files.captions.read_text())["annotations"]
    images = json.loads(files.instances.read_text())["images"]
    (root / "orig").mkdir()
    for s in range(SHARDS):
        with wds.TarWriter(str(root / "orig" / f"{s:05d}.tar")) as sink:
            for image in images[s * PER_SHARD : (s + 1) * PER_SHARD]:
                caption = next(c["caption"] for c in captions if c["image_id"] == image["id"])
                jpg = _jpeg(files.images / image["file_name"])
                sink.write({"__key__": f"{image['id']:09d}", "jpg": jpg, "txt": caption})
    argv = synth_args(files, root / "syn", "--runner", "local", "--image-method", "blur")
    assert main([*argv, "--contact-sheet", "0"]) == 0
    assert list((root / "syn").glob("shard-*.tar"))
    return root


def test_open_clip_trains_on_the_flags_counterfactual_mix_prints(shards, capsys, tmp_path):
    mix_json = tmp_path / "mix.json"
    argv = ["mix", "--original", str(shards / "orig"), "--synthetic", str(shards / "syn")]
    assert main([*argv, "--ratio", "0.1", "--out", str(mix_json)]) == 0
    printed = capsys.readouterr().out.splitlines()
    flags = shlex.split(printed[printed.index("open_clip flags:") + 1])
    plan = json.loads(mix_json.read_text())
    assert plan["version"] == PLAN_VERSION and flags == plan["open_clip"]["args"]
    train_data = flags[flags.index("--train-data") + 1]
    factors = flags[flags.index("--train-data-upsampling-factors") + 1]
    assert train_data == f"{shards}/orig/{{00000..00001}}.tar::{plan['synthetic']['pattern']}"
    assert factors.split("::")[0] == "1" and len(factors.split("::")) == 2  # one per pattern
    assert flags[flags.index("--train-num-samples") + 1] == "4"  # round(4 * 1.1)

    logs, model = tmp_path / "logs", tiny_open_clip_dir(tmp_path / "model")
    command = [sys.executable, "-m", "open_clip_train.main", *flags]
    command += ["--dataset-type", "webdataset", "--model", model, "--device", "cpu"]
    command += ["--precision", "fp32", "--batch-size", "2", "--workers", "0", "--epochs", "1"]
    command += ["--lr", "1e-5", "--warmup", "1", "--seed", "0", "--log-every-n-steps", "1"]
    command += ["--report-to", "", "--logs", str(logs), "--name", "mix", "--save-frequency", "1"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
    log = (logs / "mix" / "out.log").read_text() if (logs / "mix" / "out.log").exists() else ""
    assert done.returncode == 0, done.stderr[-3000:]
    assert (logs / "mix" / "checkpoints" / "epoch_1.pt").stat().st_size > 0, log[-3000:]
    steps = re.findall(r"Train Epoch: 0 \[\s*(\d+)/4 .*Contrastive_loss: ([0-9.]+)", log)
    assert [int(n) for n, _ in steps] == [2, 4], log[-3000:]  # two steps of two samples
    assert all(float(loss) > 0 for _, loss in steps)
    # open_clip skips a sample or shard it cannot read with this warning, and trains on
    assert "Handling webdataset error" not in log + done.stderr
    params = (logs / "mix" / "params.txt").read_text()
    assert f"train_data: {train_data}" in params and f"model: {model}" in params
