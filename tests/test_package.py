"""The package as users install it: configs by name, the bundled configs' list, a missing extra
as one line, ``--version``, and a wheel that installs ``counterfactual`` with its subpackage
``counterfactual.pipelines`` and its configs (nothing else at the top of site-packages) and runs
the demo from another folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import counterfactual
from counterfactual.cli import main
from counterfactual.cli.config import bundled_configs, config_path, describe

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "counterfactual" / "pipelines" / "configs"

BLOCK = """
import sys

class Block:
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None

sys.meta_path.insert(0, Block())
from counterfactual.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""A child process's script: the CLI, with the modules ``names`` (and their submodules) not
importable, as when their extra is not installed."""


def offline_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        **extra,
    )
    return env


def cli_without(names: set[str], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = offline_env(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(names=names), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- configs by name ---------------------------------------------------------------------


def test_bundled_configs_are_the_repository_folder():
    assert bundled_configs() == {p.stem: p for p in sorted(CONFIGS.glob("*.yaml"))}
    assert {"demo", "coco", "coco-rorem", "flickr30k"} <= set(bundled_configs())


@pytest.mark.parametrize("name", ["coco", "coco.yaml", "demo", "demo.yaml"])
def test_a_name_is_a_bundled_config(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: names do not depend on the folder
    assert config_path(name) == CONFIGS / f"{name.removesuffix('.yaml')}.yaml"


def test_a_path_wins_and_a_missing_path_is_left_to_the_loader(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "coco.yaml").write_text("seed: 3\n")
    assert config_path("coco.yaml") == Path("coco.yaml")  # a file here, not the bundled one
    assert config_path(str(tmp_path / "coco.yaml")) == tmp_path / "coco.yaml"
    missing = tmp_path / "sub" / "demo.yaml"
    assert config_path(str(missing)) == missing  # a path: its own error, not the bundled demo


def test_an_unknown_name_lists_the_bundled_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="neither a file nor a bundled config") as err:
        config_path("cocoa")
    assert all(name in str(err.value) for name in bundled_configs())
    assert main(["synth", "--config", "cocoa", "--out", str(tmp_path / "out")]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("counterfactual synth: error: config 'cocoa' is neither")
    assert len(err_text.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_synth_and_models_read_a_config_by_name(tmp_path, monkeypatch):
    """``--config demo`` from another folder: the demo's options become synth's defaults."""
    from counterfactual.cli import build_parser
    from counterfactual.cli.config import load_config

    monkeypatch.chdir(tmp_path)
    synth = build_parser().get_default("_subcommands")["synth"]
    defaults = load_config(config_path("demo"), synth)
    assert defaults["dataset"] == "demo" and defaults["inpaint_backend"] == "exemplar"
    assert main(["models", "list", "--config", "demo"]) == 0  # the demo loads no model
    assert main(["models", "list", "--config", "demo.yaml"]) == 0


def test_configs_lists_every_bundled_config_with_its_line(capsys):
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(bundled_configs())
    for line, path in zip(lines, bundled_configs().values(), strict=True):
        text = describe(path)
        assert line.endswith(text) and 20 <= len(text) <= 100, path.name
    assert main(["configs", "--paths"]) == 0
    paths = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert paths == [str(p) for p in bundled_configs().values()]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_bundled_config_starts_with_its_description(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# ") and describe(path) == first[2:].strip()


# --- a missing extra ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "hidden, argv, extras, named",
    [
        ({"skimage"}, ("synth", "--config", "demo", "--runner", "local"), "demo", "skimage is"),
        ({"ray"}, ("synth", "--config", "demo", "--runner", "ray"), "ray", "ray is"),
        ({"ray"}, ("synth", "--dataset", "demo", "--runner", "ray", "--dry-run"), "ray", "ray is"),
        (
            {"skimage", "ray"},
            ("synth", "--config", "demo", "--runner", "ray"),
            "demo,ray",
            "skimage and ray are",
        ),
        (
            {"torch", "ray"},
            ("synth", "--config", "coco", "--root", "coco"),
            "models,ray",
            "torch and ray are",
        ),
    ],
    ids=[
        "demo-without-scikit-image",
        "demo-without-ray",
        "dry-run-without-ray",
        "without-both",
        "coco-without-torch-and-ray",
    ],
)
def test_a_missing_extra_is_one_line_that_names_it(hidden, argv, extras, named, tmp_path):
    """Before anything starts (no OUT made), one line names every missing extra, exit 2."""
    out = tmp_path / "out"
    done = cli_without(hidden, *argv, "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        f"counterfactual synth: error: {named} needed here but not installed: "
        f"pip install -e '{REPO}[{extras}]'"  # the clone it runs from: no index has a release
    ]
    assert not out.exists()


def test_require_names_the_extra_and_is_a_setup_error_wherever_it_is_raised():
    """``require`` deep in a command (the eval's plot, a model step on a Ray node) raises a
    ``MissingExtra`` that the CLI ends with one line, exit 2, also wrapped as Ray wraps it."""
    from counterfactual._lazy import MissingExtra, require
    from counterfactual.cli import setup_error

    with pytest.raises(MissingExtra, match=r"pip install -e '.+\[tools\]'") as err:
        require("no_such_module_for_this_test", "tools")
    assert isinstance(err.value, ImportError) and setup_error(err.value) is err.value
    wrapped = RuntimeError("task failed")
    wrapped.cause = err.value  # type: ignore[attr-defined]  # a RayTaskError's cause
    assert setup_error(wrapped) is err.value


# --- --version ----------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([flag])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"counterfactual {counterfactual.__version__} (counterfactual-vl, ")
    assert str(Path(counterfactual.__file__).parent) in out


# --- the installed layout -----------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built offline from a copy of the sources (a build in the
    repository would leave build/ and *.egg-info there)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "counterfactual", src / "counterfactual", ignore=ignore)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(dist), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = dist.glob("*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package(wheel):
    assert wheel.name.startswith(f"counterfactual_vl-{counterfactual.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"counterfactual", f"counterfactual_vl-{counterfactual.__version__}.dist-info"}
    assert "counterfactual/pipelines/synth.py" in names
    assert "counterfactual/pipelines/__init__.py" in names
    shipped = {
        n.rsplit("/", 1)[1] for n in names if n.startswith("counterfactual/pipelines/configs/")
    }
    assert shipped == {p.name for p in CONFIGS.glob("*.yaml")}
    data = {p.name for p in (REPO / "counterfactual" / "data").iterdir()}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("counterfactual/data/")} == data


@pytest.mark.slow
def test_the_installed_package_runs_the_demo_by_name_from_another_folder(wheel, tmp_path):
    """Installed from the wheel (its dependencies from this environment) and run from an
    empty folder: ``--version``, ``configs`` and the demo by name, on Ray (``--runner ray``)."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == [
        "bin",
        "counterfactual",
    ]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = offline_env(PYTHONPATH=str(site))

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "counterfactual", *argv],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    version = cli("--version")
    assert version.returncode == 0, version.stderr
    assert f"({counterfactual.DISTRIBUTION}, {site / 'counterfactual'})" in version.stdout
    listed = cli("configs", "--paths")
    assert listed.returncode == 0, listed.stderr
    assert f"{site}/counterfactual/pipelines/configs/coco.yaml" in listed.stdout
    run = cli(
        "synth",
        "--config",
        "demo",
        "--out",
        "out",
        "--runner",
        "ray",
        "--num-cpus",
        "2",
        "--no-dashboard",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "(ray)" in run.stderr
    assert sorted(p.name for p in (work / "out").glob("shard-*.tar")) == ["shard-000000.tar"]


# --- python -m build, twine check, the sdist installed ------------------------------------


def _build(src: Path, dist: Path) -> None:
    """``python -m build --no-isolation`` (offline: this environment's setuptools); where
    ``build`` is not installed, the same PEP 517 hooks of the project's backend it calls."""
    try:
        import build  # noqa: F401
    except ImportError:
        hooks = "from setuptools import build_meta as b; b.build_sdist({d!r}); b.build_wheel({d!r})"
        argv = [sys.executable, "-c", hooks.format(d=str(dist))]
    else:
        argv = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), "."]
    done = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and wheel, built from the files git tracks (as a fresh clone has them)."""
    src = tmp_path_factory.mktemp("clone")
    tracked = (
        subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    _build(src, dist)
    (sdist,) = dist.glob("*.tar.gz")
    (whl,) = dist.glob("*.whl")
    return {"sdist": sdist, "wheel": whl}


@pytest.mark.slow
def test_build_makes_an_sdist_and_a_wheel_twine_passes(dists):
    version = counterfactual.__version__
    assert dists["sdist"].name == f"counterfactual_vl-{version}.tar.gz"
    assert dists["wheel"].name == f"counterfactual_vl-{version}-py3-none-any.whl"
    pytest.importorskip("twine", reason="twine (the dev extra) is not installed")
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dists.values())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


@pytest.mark.slow
def test_the_sdist_installs_and_runs_the_demo(dists, tmp_path):
    """The sdist built and installed by pip (offline, the dependencies from this environment),
    then the demo by name from an empty folder, in-process: its next steps at the end."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--no-build-isolation", "--target", str(site), str(dists["sdist"])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "counterfactual" / "pipelines" / "configs" / "demo.yaml").is_file()
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "counterfactual", "synth", "--config", "demo", "--out", "out"]
        + ["--runner", "local"],
        cwd=work, env=offline_env(PYTHONPATH=str(site)), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (work / "out" / "shard-000000.tar").stat().st_size > 0
    assert run.stderr.rstrip().splitlines()[-2] == "  counterfactual check out    # verify every " \
        "shard against its records"  # fmt: skip
