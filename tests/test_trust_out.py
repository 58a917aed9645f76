"""OUT is never someone else's folder, and nothing written follows a link we did not make.

Each scenario runs the real CLI as a user would (``python -m counterfactual``): ``synth`` and
``report`` refuse a folder that is neither empty nor theirs with one line and exit 2, before
anything is written; ``--force-out`` writes beside other files, never over them; a link planted
at a name we write is replaced, its target untouched; a killed run's Ray folder is removed by
the next run, a live run's kept; Ray's own lines carry no colour codes off a terminal."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual import fs
from counterfactual.readers.generate import CocoFiles, generate_coco

USER_README = "# my project\n\n" + "A line the user wrote.\n" * 50


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> CocoFiles:
    return generate_coco(tmp_path_factory.mktemp("coco"), 4, seed=1, size=(96, 72))


@pytest.fixture(scope="module")
def done_run(coco, tmp_path_factory) -> Path:
    """A finished synth run, copied by the tests that change it."""
    out = tmp_path_factory.mktemp("run") / "out"
    proc = synth(coco, out)
    assert proc.returncode == 0, proc.stderr
    return out


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def synth(coco: CocoFiles, out: Path | str, *extra: str, cwd: Path | None = None):
    args = synth_args(coco, Path(out), "--image-method", "blur", "--contact-sheet", "0", *extra)
    return cli(*args, cwd=cwd)


def error_line(proc: subprocess.CompletedProcess[str], command: str = "synth") -> str:
    """The one line a refused command prints (exit 2)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"counterfactual {command}: error: "), proc.stderr
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, a link's target."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = path.read_bytes()
    return out


# --- synth --out ------------------------------------------------------------------------------


def test_a_folder_with_a_users_readme_is_refused_and_untouched(coco, tmp_path):
    out = tmp_path / "project"
    out.mkdir()
    (out / "README.md").write_text(USER_README)
    line = error_line(synth(coco, out))
    assert line == (
        f"counterfactual synth: error: --out {out}: the folder is not empty and not a synth run "
        "(README.md); nothing was written. Pass a new or empty folder, or --force-out to write "
        "beside them"
    )
    assert snapshot(out) == {"README.md": USER_README.encode()}


def test_out_dot_in_a_project_folder_is_refused(coco, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text(USER_README)
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    (project / "src").mkdir()
    before = snapshot(project)
    line = error_line(synth(coco, ".", cwd=project))
    assert (
        "--out .: the folder is not empty and not a synth run (README.md, pyproject.toml, src)"
        in line
    )
    assert snapshot(project) == before


def test_a_users_manifest_is_not_taken_for_a_run(coco, tmp_path):
    """Recognised by content: a ``manifest.json`` and ``run.json`` of the user's are not ours."""
    out = tmp_path / "data"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"files": ["a.jpg"], "runs": [1, 2]}))
    (out / "run.json").write_text(json.dumps({"name": "my run"}))
    before = snapshot(out)
    assert "not a synth run (manifest.json, run.json)" in error_line(synth(coco, out))
    assert snapshot(out) == before


def test_force_out_writes_beside_never_over(coco, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    (out / "data" / "README.md").write_text(USER_README)
    proc = synth(coco, out, "--force-out")
    assert proc.returncode == 0, proc.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "data" / "README.md").read_text() == USER_README
    assert {"README.md", "manifest.json", "status.jsonl", "shard-000000.tar"} <= set(
        os.listdir(out)
    )
    # the folder now holds a run: a rerun needs no --force-out and resumes it
    again = synth(coco, out)
    assert again.returncode == 0, again.stderr
    assert "(1 from an earlier run)" in again.stdout
    assert (out / "notes.txt").read_text() == "mine"

    # a file of the user's at one of the names a run writes: refused even with --force-out
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    (other / "status.jsonl").write_text('{"mine": 1}\n')
    before = snapshot(other)
    line = error_line(synth(coco, other, "--force-out"))
    assert line == (
        f"counterfactual synth: error: --out {other}: status.jsonl is not from a synth run, and "
        "--force-out never writes over another file; nothing was written. Move it, or pass "
        "another folder"
    )
    assert snapshot(other) == before


def test_a_rerun_into_our_own_out_resumes(coco, done_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(done_run, out)
    (out / "my-notes.txt").write_text("a note beside the run")
    proc = synth(coco, out)
    assert proc.returncode == 0, proc.stderr
    assert "(1 from an earlier run)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards_resumed"] == 1
    assert len(manifest["runs"]) == 2


def test_a_killed_first_run_is_still_ours(coco, tmp_path):
    """A run killed before it wrote ``run.json`` leaves its lock: the rerun takes it over."""
    out = tmp_path / "out"
    out.mkdir()
    lock = {
        "host": "gone-host",
        "pid": 1,
        "runner": "local",
        "started": "2026-01-01T00:00:00Z",
        "heartbeat": "2026-01-01T00:00:00Z",
        "token": "0123456789abcdef",
    }
    (out / "run.lock").write_text(json.dumps(lock))
    proc = synth(coco, out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "run.json").is_file()


def test_links_planted_at_our_names_are_replaced_not_followed(coco, done_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(done_run, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("README.md", "manifest.json", "status.jsonl", "sizes.json", "contact_sheet.png"):
        (outside / name).write_text(f"the user's {name}")
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(outside / name)
    before = snapshot(outside)
    args = synth_args(coco, out, "--image-method", "blur", "--contact-sheet", "2")
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert snapshot(outside) == before
    for name in ("README.md", "manifest.json", "status.jsonl", "sizes.json", "contact_sheet.png"):
        assert not (out / name).is_symlink(), name
        assert (out / name).is_file(), name
    assert "datasets" in (out / "README.md").read_text() or (out / "README.md").stat().st_size
    assert json.loads((out / "manifest.json").read_text())["shards"] == 1


def test_atomic_write_replaces_a_link_and_leaves_its_target(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / "out.txt"
    link.symlink_to(target)
    fs.write_text(link, "new")
    assert target.read_text() == "keep"
    assert not link.is_symlink()
    assert link.read_text() == "new"


# --- report -----------------------------------------------------------------------------------


def test_report_replaces_a_linked_report_folder(done_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(done_run, out)
    outside = tmp_path / "outside"
    (outside / "samples").mkdir(parents=True)
    (outside / "sheet-00.png").write_text("the user's picture")
    (outside / "index.html").write_text("the user's page")
    (outside / "samples" / "000-abc-mask.png").write_text("matches our naming pattern")
    before = snapshot(outside)
    (out / "report").symlink_to(outside)
    proc = cli("report", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out / "report" / "index.html")
    assert snapshot(outside) == before
    report = out / "report"
    assert not report.is_symlink() and report.is_dir()
    assert "<title>counterfactual report:" in (report / "index.html").read_text()
    assert (report / "sheet-00.png").read_bytes()[:4] == b"\x89PNG"


def test_report_replaces_links_inside_its_folder(done_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(done_run, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.png").write_text("the user's")
    first = cli("report", str(out))
    assert first.returncode == 0, first.stderr
    (out / "report" / "sheet-00.png").unlink()
    (out / "report" / "sheet-00.png").symlink_to(outside / "keep.png")
    shutil.rmtree(out / "report" / "samples")
    (out / "report" / "samples").symlink_to(outside)
    proc = cli("report", str(out))
    assert proc.returncode == 0, proc.stderr
    assert snapshot(outside) == {"keep.png": b"the user's"}
    assert not (out / "report" / "sheet-00.png").is_symlink()
    assert not (out / "report" / "samples").is_symlink()
    assert any((out / "report" / "samples").iterdir())


def test_a_report_cut_short_is_still_ours(done_run, tmp_path):
    """A report that died before its ``index.html``: its sheets and samples are recognised."""
    out = tmp_path / "out"
    shutil.copytree(done_run, out)
    assert cli("report", str(out)).returncode == 0
    (out / "report" / "index.html").unlink()
    proc = cli("report", str(out))
    assert proc.returncode == 0, proc.stderr
    (out / "report" / "index.html").unlink()
    (out / "report" / "sheet-00.png").write_text("not a picture")
    error_line(cli("report", str(out)), "report")


def test_report_out_of_someone_else_is_refused(done_run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.html").write_text("<html>my site</html>")
    (mine / "style.css").write_text("body {}")
    before = snapshot(mine)
    line = error_line(cli("report", str(done_run), "--out", str(mine)), "report")
    assert "the folder is not empty and not a report (index.html, style.css)" in line
    line = error_line(cli("report", str(done_run), "--out", str(mine), "--force-out"), "report")
    assert "index.html is not from a report, and --force-out never writes over" in line
    assert snapshot(mine) == before
    # beside other files with --force-out; then it is a report, rewritten without it
    (mine / "index.html").unlink()
    proc = cli("report", str(done_run), "--out", str(mine), "--force-out")
    assert proc.returncode == 0, proc.stderr
    assert (mine / "style.css").read_text() == "body {}"
    again = cli("report", str(done_run), "--out", str(mine))
    assert again.returncode == 0, again.stderr


# --- Ray's leftovers --------------------------------------------------------------------------


def _ray_dir_maker(base: Path) -> subprocess.Popen[str]:
    """A process that makes a Ray folder in ``base`` as a run does, says its path and waits."""
    code = (
        "import sys, time\n"
        "from counterfactual.pipelines.session import ray_temp_dir\n"
        "print(ray_temp_dir(), flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {**os.environ, "TMPDIR": str(base)}
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.slow
def test_a_killed_runs_ray_folder_is_removed_by_the_next_run(tmp_path):
    """A run killed (SIGKILL) leaves its ``cf-ray-*`` folder; the next run that starts Ray
    (here ``synth --runner ray --dry-run``) removes it and keeps a live run's."""
    pytest.importorskip("ray")
    base = Path(tempfile.mkdtemp(prefix="cft", dir="/tmp"))  # short: Ray's socket paths
    try:
        killed, live = _ray_dir_maker(base), _ray_dir_maker(base)
        assert killed.stdout is not None and live.stdout is not None
        stale, alive = Path(killed.stdout.readline().strip()), Path(live.stdout.readline().strip())
        (stale / "session_x" / "logs").mkdir(parents=True)
        (stale / "session_x" / "logs" / "raylet.out").write_text("a killed run's log")
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert stale.is_dir() and alive.is_dir()
        started = time.time()
        env = {**os.environ, "TMPDIR": str(base)}
        proc = subprocess.run(
            [sys.executable, "-m", "counterfactual", "synth", "--runner", "ray", "--dry-run",
             "--num-cpus", "1", "--no-dashboard", "--image-method", "blur"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert not stale.exists()
        assert alive.is_dir()
        assert [p for p in base.glob("cf-ray-*")] == [alive]  # the dry run's own removed too
        assert time.time() - started < 120
    finally:
        for proc_ in (live,):
            proc_.kill()
            proc_.wait()
        shutil.rmtree(base, ignore_errors=True)


def test_a_ray_folder_without_an_owner_or_of_a_live_run_is_kept(tmp_path):
    from counterfactual.pipelines.session import RAY_DIR_OWNER, remove_stale_ray_dirs

    unknown = tmp_path / "cf-ray-older"
    unknown.mkdir()
    mine = tmp_path / "cf-ray-live"
    mine.mkdir()
    owner = {"host": os.uname().nodename, "pid": os.getpid(), "pid_start": None}
    (mine / RAY_DIR_OWNER).write_text(json.dumps(owner))
    dead = tmp_path / "cf-ray-dead"
    dead.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (dead / RAY_DIR_OWNER).write_text(json.dumps({**owner, "pid": int(gone.stdout)}))
    elsewhere = tmp_path / "cf-ray-elsewhere"
    elsewhere.mkdir()
    (elsewhere / RAY_DIR_OWNER).write_text(
        json.dumps({**owner, "pid": int(gone.stdout), "host": "another-node"})
    )
    assert remove_stale_ray_dirs(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cf-ray-elsewhere",
        "cf-ray-live",
        "cf-ray-older",
    ]


_PRINT_RAYLET_LINE = """
import sys
from counterfactual.pipelines.session import plain_ray_lines
plain_ray_lines()
from ray._private import worker
worker.print_to_stdstream(
    {"lines": ["A worker died or was killed while executing a task"], "pid": "raylet",
     "is_err": False},
    ignore_prefix=False,
)
"""


def test_ray_lines_are_plain_off_a_terminal():
    """Ray's own printer, as the driver calls it for ``(raylet)`` lines: no ANSI codes into a
    pipe, its colours kept on a terminal."""
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_COLOR_PREFIX"}
    piped = subprocess.run(
        [sys.executable, "-c", _PRINT_RAYLET_LINE], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "(raylet) A worker died or was killed while executing a task\n"
    assert "\x1b" not in piped.stderr

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _PRINT_RAYLET_LINE], stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0, seen
    os.close(leader)
    assert b"\x1b[33m(raylet)\x1b[0m A worker died" in seen, seen
