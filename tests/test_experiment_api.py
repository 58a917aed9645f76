"""Issue 34, point 3: the experiment calls the library with config objects. No command line in
``world/experiment.py`` (no import of the CLI, no ``--flag`` string); each step's config equals
the one its command builds from the flags the experiment used to pass (so the outputs stay
byte-identical); a renamed config field fails where the config is built."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import counterfactual.train.config as train_config_module
import counterfactual.world.experiment as experiment
from counterfactual.cli import build_parser
from counterfactual.cli import eval as eval_cli
from counterfactual.cli import synth as synth_cli
from counterfactual.cli import train as train_cli
from counterfactual.synth.plan import Runtime
from counterfactual.world.experiment import (
    ExperimentConfig,
    eval_run,
    synth_config,
    synth_spec,
    train_config,
)
from counterfactual.world.scene import WorldConfig
from counterfactual.world.write import COCO_SET, World

SOURCE = Path(experiment.__file__)


def _tree() -> ast.Module:
    return ast.parse(SOURCE.read_text("utf-8"))


def _strings(node: ast.AST) -> list[str]:
    """The string constants under ``node``, but in ``declare(...)`` (an option's declaration on
    its config field, which names its flag)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "declare":
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    return [s for child in ast.iter_child_nodes(node) for s in _strings(child)]


def test_the_experiment_imports_no_cli_and_builds_no_flag() -> None:
    imported = []
    for node in ast.walk(_tree()):  # lazy imports inside functions included
        if isinstance(node, ast.ImportFrom):
            imported.append(node.module or "")
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    assert imported and not [m for m in imported if m.split(".")[:2] == ["counterfactual", "cli"]]
    flags = [value for value in _strings(_tree()) if value.startswith("--")]
    assert flags == []
    assert "command" not in inspect.signature(experiment.run_experiment).parameters


CONFIGS = ("SynthConfig", "SelectionConfig", "TextConfig", "TrainConfig", "EvalRun", "DataSpec")


def test_every_config_is_built_with_keywords_it_has() -> None:
    """Each call of a config class in the module: keyword arguments only, each a field."""
    classes = {
        "SynthConfig": experiment.SynthConfig,
        "SelectionConfig": __import__(
            "counterfactual.method.selection"
        ).method.selection.SelectionConfig,
        "TextConfig": __import__("counterfactual.text").text.TextConfig,
        "TrainConfig": train_config_module.TrainConfig,
        "EvalRun": experiment.EvalRun,
        "DataSpec": experiment.DataSpec,
    }
    calls = [
        node
        for node in ast.walk(_tree())
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in CONFIGS
    ]
    assert {c.func.id for c in calls} == set(CONFIGS)
    for call in calls:
        names = {f.name for f in dataclasses.fields(classes[call.func.id])}
        assert not call.args, f"{call.func.id} built with positional arguments"
        given = {k.arg for k in call.keywords if k.arg is not None}
        assert given and given <= names, (call.func.id, given - names)


def _world(tmp_path: Path) -> World:
    return World(tmp_path / "world", WorldConfig(images=60, val=0, test=10), {})


def _parse(*argv: object) -> object:
    return build_parser().parse_args([str(a) for a in argv])


@pytest.mark.parametrize(
    ("image", "text", "captions", "policy"),
    [
        ("inpaint", "np-removal", "one", "uniform"),
        ("blur", "prompt", "all", "spurious"),
        ("zero", "np-removal", "one", "all"),
    ],
)
def test_synth_config_is_the_commands(
    tmp_path: Path, image: str, text: str, captions: str, policy: str
) -> None:
    """The flags the experiment passed to ``counterfactual synth`` before, parsed by the CLI."""
    world = _world(tmp_path)
    config = ExperimentConfig(image_method=image, text_method=text, seed=3)
    argv = [
        "synth", "--runner", "local", "--dataset", "coco", "--root", world.root,
        "--coco-set", COCO_SET, "--split-file", world.split_file, "--split", "train",
        "--vocabulary", world.vocabulary, "--text-method", text, "--captions-per-image",
        captions, "--seed", 3, "--contact-sheet", 4, "--out", tmp_path / "out",
        "--image-method", image, "--policy", policy,
    ]  # fmt: skip
    if image == "inpaint":
        argv += ["--inpaint-backend", "opencv"]
    args = _parse(*argv)
    assert synth_config(world, config, captions, policy) == synth_cli.build_config(args)
    assert synth_cli.build_runtime(args) == Runtime()  # run_local's default
    assert synth_spec(world, "train") == synth_cli.data_spec(args)
    assert experiment.CONTACT_SHEET == args.contact_sheet


@pytest.mark.parametrize("synthetic", [False, True])
def test_train_config_is_the_commands(tmp_path: Path, synthetic: bool) -> None:
    config = ExperimentConfig(steps=7, batch_size=16, device="cpu", workers=0, lr=1e-3)
    init, original, d_prime = tmp_path / "init", tmp_path / "d", tmp_path / "d-prime"
    argv = [
        "train", "--recipe", "scratch", "--model", init, "--original", original,
        "--mix", "ratio", "--epochs", 1, "--batch-size", 16, "--lr", 1e-3,
        "--samples-per-epoch", 7 * 16, "--seed", 5, "--device", "cpu", "--out", tmp_path,
        "--log-every", 100, "--num-workers", 0,
    ]  # fmt: skip
    ratio = 0.1912345678  # the natural ratio: as the command line carried it, 6 digits
    if synthetic:
        argv += ["--synthetic", d_prime, "--ratio", f"{ratio:.6g}"]
    built = train_config(init, original, d_prime if synthetic else None, ratio, config, 5)
    assert built == train_cli.build_config(_parse(*argv))
    assert built.ratio == (0.191235 if synthetic else train_config_module.TrainConfig.ratio)


@pytest.mark.parametrize("recall", [True, False])
def test_eval_run_is_the_commands(tmp_path: Path, recall: bool) -> None:
    world = _world(tmp_path)
    queries, cache, out = tmp_path / "q", tmp_path / "cache", tmp_path / "eval"
    models = [tmp_path / "D" / "final", tmp_path / "D+D'" / "final"]
    argv = [
        "eval", "--dataset", "coco", "--root", world.root, "--split-file", world.split_file,
        "--queries", queries, "--vocabulary", world.vocabulary, "--out", out, "--cache", cache,
        "--device", "cpu", "--grid", 0, "--batch-size", 256,
    ]  # fmt: skip
    for model in models:
        argv += ["--model", f"scratch:{model}"]
    if not recall:
        argv.append("--no-recall")
    built = eval_run(world, queries, models, out, cache, ExperimentConfig(), recall)
    assert built == eval_cli.eval_run(_parse(*argv))


def _renamed(cls: type, old: str) -> type:
    """``cls``'s fields as a plain dataclass with field ``old`` renamed: a config after a
    rename."""
    specs = []
    for f in dataclasses.fields(cls):
        default = (
            dataclasses.field(default=f.default)
            if f.default is not dataclasses.MISSING
            else dataclasses.field(default_factory=f.default_factory)
            if f.default_factory is not dataclasses.MISSING
            else dataclasses.field()
        )
        specs.append((f"{f.name}_renamed" if f.name == old else f.name, f.type, default))
    return dataclasses.make_dataclass(cls.__name__, specs, frozen=True)


@pytest.mark.parametrize("field", ["samples_per_epoch", "num_workers", "original", "log_every"])
def test_a_renamed_train_field_fails_where_the_config_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    renamed = _renamed(train_config_module.TrainConfig, field)
    monkeypatch.setattr(train_config_module, "TrainConfig", renamed)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{field}'"):
        train_config(tmp_path, tmp_path, None, 1.0, ExperimentConfig(), 0)


@pytest.mark.parametrize("field", ["vocabulary", "captions", "seed"])
def test_a_renamed_synth_field_fails_where_the_config_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    monkeypatch.setattr(experiment, "SynthConfig", _renamed(experiment.SynthConfig, field))
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{field}'"):
        synth_config(_world(tmp_path), ExperimentConfig(), "one", "uniform")
