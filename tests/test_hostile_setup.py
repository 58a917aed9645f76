"""A bad setup ends in one line on stderr and exit code 2, naming the file, key or option and
what is wrong, never a traceback (``--debug`` shows one); argparse errors are their line and a
pointer to ``--help``. Disk full: a clear line, no temporary file, and the rerun resumes."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual import fs
from counterfactual.cli import main, setup_error
from counterfactual.readers.generate import CocoFiles, generate_coco

ROOT = os.geteuid() == 0
needs_permissions = pytest.mark.skipif(ROOT, reason="root ignores file permissions")
"""Run directly as any other user; as root (CI) they run as `nobody` through
:func:`test_permission_cases_as_an_unprivileged_user`."""


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> CocoFiles:
    return generate_coco(tmp_path_factory.mktemp("coco"), 6, seed=1, size=(160, 120))


def synth(files: CocoFiles, out: Path, *extra: str) -> int:
    return main(synth_args(files, out, "--image-method", "blur", "--contact-sheet", "0", *extra))


def one_line(capsys) -> str:
    """The only line on stderr (a run prints its plan line first: a setup error found before
    the run starts leaves stderr otherwise empty)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("counterfactual synth: error: "), err
    return lines[0]


def with_instances(files: CocoFiles, instances: Path) -> CocoFiles:
    return CocoFiles(instances, files.captions, files.images)


# --- the YAML config --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("alpha1: high\n", "config.yaml: alpha1: 'high' is not a number"),
        ("alpha3: 0\n", "config.yaml: alpha3: 0 is not a number in (0, 1)"),
        ("contact_sheet: -1\n", "config.yaml: contact_sheet: -1 is not a whole number >= 0"),
        ("limit: 2.5\n", "config.yaml: limit: '2.5' is not a whole number"),
        ("verify: 'yes'\n", "config.yaml: verify: 'yes' is not true or false"),
        ("image_method: [blur]\n", "config.yaml: image_method: ['blur'] is not one of"),
        ("image_method: paint\n", "config.yaml: image_method: 'paint' is not one of"),
        ("alpha4: 0.5\n", "config.yaml: unknown option(s) alpha4"),
        ("- alpha1\n- 0.4\n", "config.yaml: expected a mapping of option names to values"),
        ("alpha1: [0.4\n", "config.yaml: not valid YAML"),
        (b"\xff\xfe\x00\x01binary", "config.yaml: not a UTF-8 text file"),
    ],
)
def test_a_bad_config_names_file_and_key(coco, tmp_path, capsys, content, expected):
    config = tmp_path / "config.yaml"
    if isinstance(content, bytes):
        config.write_bytes(content)
    else:
        config.write_text(content)
    assert synth(coco, tmp_path / "out", "--config", str(config)) == 2
    line = one_line(capsys)
    assert expected in line and str(config) in line, line
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_a_config_that_is_a_folder_or_missing(coco, tmp_path, capsys):
    assert synth(coco, tmp_path / "out", "--config", str(tmp_path)) == 2
    assert f"{tmp_path}: is a folder, not a YAML config file" in one_line(capsys)
    missing = tmp_path / "nowhere.yaml"
    assert synth(coco, tmp_path / "out", "--config", str(missing)) == 2
    assert f"{missing}: cannot read the config (No such file or directory)" in one_line(capsys)


@needs_permissions
def test_an_unreadable_config(coco, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("alpha1: 0.3\n")
    config.chmod(0)
    assert synth(coco, tmp_path / "out", "--config", str(config)) == 2
    assert f"{config}: cannot read the config (Permission denied)" in one_line(capsys)


# --- input files and folders ------------------------------------------------------------------


def test_instances_that_is_a_folder(coco, tmp_path, capsys):
    assert synth(with_instances(coco, tmp_path), tmp_path / "out") == 2
    assert f"--instances {tmp_path}: is a folder, not a file" in one_line(capsys)


def test_missing_images_folder_is_a_setup_error(coco, tmp_path, capsys):
    """Not every image a ``missing-file`` and an empty shard: one line, nothing written."""
    files = CocoFiles(coco.instances, coco.captions, tmp_path / "nonexistent")
    assert synth(files, tmp_path / "out") == 2
    assert f"--images {tmp_path / 'nonexistent'}: no such folder" in one_line(capsys)
    assert not list((tmp_path / "out").glob("shard-*"))


def test_images_that_is_a_file(coco, tmp_path, capsys):
    files = CocoFiles(coco.instances, coco.captions, coco.instances)
    assert synth(files, tmp_path / "out") == 2
    assert f"--images {coco.instances}: is a file, not a folder" in one_line(capsys)


@pytest.mark.parametrize(
    ("data", "what"),
    [
        ([1, 2], "list"),
        ({"images": "oops", "annotations": [], "categories": []}, "images"),
    ],
)
def test_instances_of_the_wrong_shape(coco, tmp_path, capsys, data, what):
    """The reader refuses the shape (a ValueError); the line names the file."""
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps(data))
    assert synth(with_instances(coco, instances), tmp_path / "out") == 2
    line = one_line(capsys)
    assert str(instances) in line and what in line, line


def test_instances_that_is_not_json(coco, tmp_path, capsys):
    instances = tmp_path / "instances.json"
    instances.write_bytes(b"\x00\x01 not json")
    assert synth(with_instances(coco, instances), tmp_path / "out") == 2
    assert str(instances) in one_line(capsys)


@needs_permissions
def test_unreadable_instances(coco, tmp_path, capsys):
    instances = tmp_path / "instances.json"
    instances.write_bytes(coco.instances.read_bytes())
    instances.chmod(0)
    assert synth(with_instances(coco, instances), tmp_path / "out") == 2
    assert f"--instances {instances}: permission denied" in one_line(capsys)


@needs_permissions
def test_an_images_folder_that_cannot_be_searched(coco, tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    for p in coco.images.iterdir():
        (images / p.name).write_bytes(p.read_bytes())
    images.chmod(0)
    try:
        assert synth(CocoFiles(coco.instances, coco.captions, images), tmp_path / "out") == 2
    finally:
        images.chmod(0o755)
    assert f"--images {images}: permission denied" in one_line(capsys)


# --- the output folder ------------------------------------------------------------------------


def test_out_that_is_a_file(coco, tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("mine")
    assert synth(coco, out) == 2
    assert f"--out {out}: is a file, not a folder" in one_line(capsys)
    assert out.read_text() == "mine"


def test_out_that_cannot_be_created(coco, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"
    assert synth(coco, out) == 2
    assert f"--out {out}: cannot create the folder (Not a directory" in one_line(capsys)


@needs_permissions
def test_out_that_is_not_writable(coco, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert synth(coco, out) == 2
    finally:
        out.chmod(0o755)
    assert f"--out {out}: permission denied" in one_line(capsys)


# --- options ----------------------------------------------------------------------------------

BAD_OPTIONS = [
    ("synth", "--limit", "-1", "a whole number > 0"),
    ("synth", "--limit", "0", "a whole number > 0"),
    ("synth", "--contact-sheet", "-1", "a whole number >= 0"),
    ("synth", "--alpha1", "0", "a number in (0, 1]"),
    ("synth", "--alpha1", "high", "'high' is not a number"),
    ("synth", "--alpha2", "1.5", "a number in (0, 1]"),
    ("synth", "--alpha3", "0", "a number in (0, 1)"),
    ("synth", "--alpha3", "1", "a number in (0, 1)"),
    ("synth", "--alpha3", "nan", "a number in (0, 1)"),
    ("synth", "--seed", "-1", "a whole number >= 0"),
    ("synth", "--detect-threshold", "1.5", "a number in [0, 1]"),
    ("synth", "--detect-nms-iou", "-0.1", "a number in [0, 1]"),
    ("synth", "--detect-max", "0", "a whole number > 0"),
    ("synth", "--detect-batch-size", "0", "a whole number > 0"),
    ("synth", "--lama-max-side", "-1", "a whole number >= 0"),
    ("synth", "--steps", "0", "a whole number > 0"),
    ("synth", "--resolution", "-512", "a whole number >= 0"),
    ("synth", "--inpaint-batch-size", "0", "a whole number > 0"),
    ("synth", "--candidates", "0", "a whole number > 0"),
    ("synth", "--dilate", "-1", "a whole number >= 0"),
    ("synth", "--blur-sigma", "0", "a number > 0"),
    ("synth", "--blur-sigma", "inf", "a number > 0"),
    ("synth", "--verify-k", "0", "a whole number > 0"),
    ("synth", "--verify-retention-k", "0", "a whole number > 0"),
    ("synth", "--verify-batch-size", "0", "a whole number > 0"),
    ("synth", "--images-per-shard", "0", "a whole number > 0"),
    ("synth", "--max-pixels", "0", "a whole number > 0"),
    ("synth", "--batch-size", "0", "a whole number > 0"),
    ("synth", "--num-cpus", "0", "a whole number > 0"),
    ("synth", "--cpu-actors", "0", "a whole number > 0"),
    ("synth", "--model-actors", "0", "a whole number > 0"),
    ("synth", "--gpus-per-actor", "0", "a number in (0, 8]"),
    ("synth", "--gpus-per-actor", "9", "a number in (0, 8]"),
    ("synth", "--model-batch-size", "0", "a whole number > 0"),
    ("synth", "--in-flight", "0", "a whole number > 0"),
    ("select", "--alpha3", "0", "a number in (0, 1)"),
    ("caption", "--seed", "-1", "a whole number >= 0"),
    ("cooccurrence", "--top", "0", "a whole number > 0"),
    ("cooccurrence", "--smoothing", "-1", "a number >= 0"),
    ("cooccurrence", "--limit", "-1", "a whole number > 0"),
    ("data", "--timeout", "0", "a number > 0"),
    ("eval", "--batch-size", "0", "a whole number > 0"),
    ("eval", "--ks", "0", "a whole number > 0"),
    ("eval", "--curve-k", "0", "a whole number > 0"),
    ("eval", "--grid", "-1", "a whole number >= 0"),
    ("filter-captions", "--batch-size", "0", "a whole number > 0"),
    ("heuristics", "--seed", "-1", "a whole number >= 0"),
    ("report", "--n", "0", "a whole number > 0"),
    ("report", "--seed", "-1", "a whole number >= 0"),
]


@pytest.mark.parametrize(("command", "option", "value", "expected"), BAD_OPTIONS)
def test_an_option_out_of_range(capsys, command, option, value, expected):
    """The error line first (naming option, value and range), then a pointer to --help: no
    usage."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, option, value])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"counterfactual {command}: error: argument {option}"), lines
    assert expected in lines[0] and value in lines[0], lines
    assert lines[1] == f"Try 'counterfactual {command} --help'."


def test_unknown_option_names_the_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", "--out", "x", "--bogus"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "counterfactual synth: error: unrecognized arguments: --bogus",
        "Try 'counterfactual synth --help'.",
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("alpha1", 0.0, "alpha1 must be in (0, 1], got 0.0"),
        ("alpha2", 1.2, "alpha2 must be in (0, 1], got 1.2"),
        ("alpha3", 0.0, "alpha3 must be in (0, 1), got 0.0"),
        ("alpha3", 1.0, "alpha3 must be in (0, 1), got 1.0"),
        ("alpha3", float("nan"), "alpha3 must be in (0, 1), got nan"),
        ("alpha1", "high", "alpha1 must be a number in (0, 1], got 'high'"),
    ],
)
def test_selection_config_ranges(field, value, message):
    from counterfactual.method.selection import SelectionConfig

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SelectionConfig(**{field: value})
    SelectionConfig(alpha1=1.0, alpha2=1.0, alpha3=0.999)  # the edges that stay meaningful


def test_selection_seed_range():
    from counterfactual.method.selection import SelectionConfig, select_many

    with pytest.raises(ValueError, match=r"seed must be an int >= 0, got -1"):
        select_many([], SelectionConfig(), seed=-1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"images_per_shard": 0}, "images_per_shard must be a whole number >= 1, got 0"),
        ({"max_pixels": -5}, "max_pixels must be a whole number >= 1, got -5"),
        ({"jpeg_quality": 101}, "jpeg_quality must be a whole number in [1, 100], got 101"),
        ({"seed": -1}, "seed must be a whole number >= 0, got -1"),
    ],
)
def test_synth_config_ranges(kwargs, message):
    from counterfactual.synth.plan import SynthConfig

    with pytest.raises(ValueError) as err:
        SynthConfig(**kwargs)
    assert str(err.value) == message


def test_mask_config_ranges():
    from counterfactual.method.masks import MaskConfig

    with pytest.raises(ValueError, match="dilate must be a whole number of pixels >= 0, got -1"):
        MaskConfig(dilate=-1)
    with pytest.raises(ValueError, match="got 1.5"):
        MaskConfig(dilate=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps must be >= 1, got 0"),
        ({"resolution": 500}, "resolution must be 0 (native) or a positive multiple of 8"),
        ({"resolution": -8}, "resolution must be 0 (native) or a positive multiple of 8"),
        ({"strength": 0.0}, "strength must be in (0, 1], got 0.0"),
        ({"guidance_scale": -1.0}, "guidance_scale must be >= 0, got -1.0"),
        ({"opencv_radius": 0}, "opencv_radius must be >= 1"),
        ({"blur_sigma": 0.0}, "blur_sigma must be > 0"),
        ({"lama_max_side": -1}, "lama_max_side must be >= 0"),
        ({"crop_padding": -0.5}, "crop_padding must be >= 0"),
    ],
)
def test_image_config_ranges(kwargs, message):
    """Library and YAML users reach the image parts without argparse's checks (here through
    the flat names, which put each option in its backend's part)."""
    from counterfactual.image import DiffusersConfig, ImageConfig

    with pytest.raises(ValueError) as err:
        ImageConfig.from_flat(kwargs)
    assert str(err.value).startswith(message)
    ImageConfig(diffusers=DiffusersConfig(resolution=0))  # native


def test_limit_keeps_exactly_the_first_images(coco, tmp_path):
    """Every one of the first N images has a status row, none after them."""
    assert synth(coco, tmp_path / "out", "--limit", "5") == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "status.jsonl").read_text().splitlines()]
    ids = json.loads(coco.instances.read_text())["images"]
    assert {str(r["image_id"]) for r in rows} == {str(im["id"]) for im in ids[:5]}


# --- disk full --------------------------------------------------------------------------------


class _FullDisk(io.FileIO):
    """A file on a disk with 100 bytes free: the write that passes them fails with ENOSPC
    (errno 28), after writing what fitted, as a full disk does."""

    free = 100

    def write(self, data) -> int:  # type: ignore[override]
        room = self.free - self.tell()
        if len(data) > room:
            super().write(bytes(data)[: max(room, 0)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        return super().write(data)


def fill_disk_at(monkeypatch, name: str) -> None:
    """Writes of ``name`` (under its temporary name) through :mod:`counterfactual.fs` hit a
    full disk. (A real full disk needs root: the lowest write the library makes is faked.)"""

    def open_(file, mode="r", *args, **kwargs):
        if ("w" in mode or "x" in mode) and Path(file).name.startswith(f"{name}."):
            return _FullDisk(file, "w")
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(fs, "open", open_, raising=False)


@pytest.mark.parametrize("name", ["shard-000001.tar", "shard-000001_stats.json", "status.jsonl"])
def test_disk_full_is_one_line_and_the_rerun_resumes(coco, tmp_path, capsys, monkeypatch, name):
    out = tmp_path / "out"
    args = ("--images-per-shard", "2")
    fill_disk_at(monkeypatch, name)
    assert synth(coco, out, *args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"counterfactual synth: error: disk full while writing {out / name}: free space and "
        "rerun the same command to resume"
    ), err
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert not (out / "run.lock").exists()
    assert (out / "shard-000000_stats.json").exists()  # made before the disk filled up
    monkeypatch.undo()
    assert synth(coco, out, *args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards"] == 3
    assert manifest["shards_resumed"] == (3 if name == "status.jsonl" else 1)
    rows = (out / "status.jsonl").read_text().splitlines()
    assert len({json.loads(r)["image_id"] for r in rows}) == 6


def test_a_ray_worker_disk_full_comes_back_as_a_setup_error():
    """A worker's OutputError reaches the driver inside Ray's RayTaskError: main finds it."""
    from ray.exceptions import RayTaskError

    error = fs.OutputError("disk full while writing s/shard-000003.tar: free space and rerun")
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
    wrapped = RayTaskError("ShardWorker.make", "Traceback ...\n  many lines\n", error)
    for err in (wrapped, wrapped.as_instanceof_cause()):
        assert setup_error(err) is error
    assert setup_error(RuntimeError("a bug")) is None


# --- a real process ---------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args], capture_output=True, text=True
    )


def test_a_real_process_prints_one_line_and_debug_the_traceback(coco, tmp_path):
    args = synth_args(coco, tmp_path / "out", "--config", str(tmp_path))
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"counterfactual synth: error: {tmp_path}: is a folder, not a YAML config file"
    ]
    for debug in (["--debug", *args], [*args, "--debug"]):
        proc = run_cli(*debug)
        assert proc.returncode == 1
        assert "Traceback (most recent call last)" in proc.stderr
        assert f"ValueError: {tmp_path}: is a folder" in proc.stderr


def test_a_real_process_with_a_bad_option(tmp_path):
    proc = run_cli("synth", "--contact-sheet", "-1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "counterfactual synth: error: argument --contact-sheet: -1 is not a whole number >= 0",
        "Try 'counterfactual synth --help'.",
    ]


@pytest.mark.skipif(not ROOT, reason="not root: the permission tests above run directly")
def test_permission_cases_as_an_unprivileged_user():
    """Root reads files whatever their mode, so as root the permission tests run again as
    ``nobody`` (setpriv), in a temp folder that user can write (pytest's own is root's)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("no setpriv to drop root")
    closed = closed_to_nobody()
    if closed is not None:
        pytest.skip(f"nobody cannot read {closed.path} (a private checkout or venv): {closed.why}")
    base = Path(tempfile.mkdtemp(prefix="cf-nobody-"))
    os.chmod(base, 0o777)
    try:
        _run_as_nobody(setpriv, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass(frozen=True)
class Closed:
    """A path other users cannot reach, and why."""

    path: Path
    why: str


def closed_to_others(path: Path) -> Closed | None:
    """The first folder on the way to ``path`` (``path`` included) that other users cannot
    enter, or ``path`` itself when they cannot read it; ``None`` when they can."""
    path = path.resolve()
    for folder in [*reversed(path.parents), path]:
        mode = folder.stat().st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return Closed(folder, f"mode {stat.S_IMODE(mode):04o}, others may not enter it")
    mode = path.stat().st_mode
    if not mode & stat.S_IROTH:
        return Closed(path, f"mode {stat.S_IMODE(mode):04o}, others may not read it")
    return None


def closed_to_nobody() -> Closed | None:
    """What ``nobody`` cannot read of what the permission tests run from: the checkout, the
    Python and the venv's packages (pytest's and this project's imports)."""
    here = Path(__file__).resolve().parent.parent
    needed = [here, Path(sys.executable), Path(sys.prefix), Path(pytest.__file__).parent]
    return next((c for p in needed if (c := closed_to_others(p)) is not None), None)


def test_permission_tests_skip_in_a_private_folder():
    """A checkout under a folder of mode 0700 (``mktemp -d``, ``/root``): nobody cannot read
    it, the ``nobody`` re-run is skipped with the folder and its mode; opened, it runs."""
    base = Path(tempfile.mkdtemp(prefix="cf-private-", dir="/tmp"))
    try:
        inner = base / "checkout" / "tests"
        inner.mkdir(parents=True)
        (inner / "test_x.py").write_text("", "utf-8")
        os.chmod(base, 0o700)
        assert closed_to_others(inner / "test_x.py") == Closed(
            base, "mode 0700, others may not enter it"
        )
        os.chmod(base, 0o755)
        assert closed_to_others(inner / "test_x.py") is None
        os.chmod(inner / "test_x.py", 0o600)
        assert closed_to_others(inner / "test_x.py") == Closed(
            inner / "test_x.py", "mode 0600, others may not read it"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run_as_nobody(setpriv: str, base: Path) -> None:
    here = Path(__file__).resolve()
    names = [
        "test_an_unreadable_config",
        "test_unreadable_instances",
        "test_an_images_folder_that_cannot_be_searched",
        "test_out_that_is_not_writable",
    ]
    done = subprocess.run(
        [
            setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--basetemp={base / 'bt'}", str(here), "-k", " or ".join(names),
        ],
        capture_output=True, text=True, cwd=here.parent.parent,
        env={**os.environ, "HOME": str(base)}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(names)} passed" in done.stdout, done.stdout[-2000:]
