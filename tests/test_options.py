"""Options declared on config fields (counterfactual.options): the command line adds them,
builds the configs from them, and every declared option is on the command line."""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from counterfactual.cli import build_parser
from counterfactual.cli.options import add_options, build
from counterfactual.cli.synth import build_config, build_runtime, ray_options
from counterfactual.cli.train import build_config as train_config
from counterfactual.eval.evaluate import EvalConfig
from counterfactual.method.detect import DetectConfig
from counterfactual.method.masks import MaskConfig
from counterfactual.method.selection import SelectionConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.options import CliOption, declare, declared, option
from counterfactual.pipelines.options import RayOptions
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.text import TextConfig
from counterfactual.tools.audit.distractors import DistractorConfig
from counterfactual.tools.grounding.persons import FilterConfig
from counterfactual.train.trainer import TrainConfig
from counterfactual.world.experiment import ExperimentConfig
from counterfactual.world.scene import WorldConfig

SYNTH = (
    SelectionConfig,
    MaskConfig,
    DetectConfig,
    VerifyConfig,
    TextConfig,
    SynthConfig,
    Runtime,
    RayOptions,
)


def _subparser(name: str, *path: str) -> argparse.ArgumentParser:
    parser = build_parser()._defaults["_subcommands"][name]
    for step in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[step]
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


@pytest.mark.parametrize(
    ("command", "classes"),
    [
        (("synth",), SYNTH),
        (("train",), (TrainConfig,)),
        (("audit", "distractors"), (DistractorConfig,)),
        (("world",), (WorldConfig,)),
        (("experiment",), (ExperimentConfig,)),
        (("eval",), (EvalConfig,)),
        (("filter-captions",), (FilterConfig,)),
    ],
)
def test_every_declared_option_is_on_the_command_line(command, classes) -> None:
    actions = _actions(_subparser(*command))
    for cls in classes:
        for d in declared(cls):
            action = actions.get(d.flags[0])
            assert action is not None, f"{cls.__name__}.{d.field}: {d.flags} not on {command}"
            assert set(d.flags) <= set(action.option_strings)  # bool kinds add --no-X
            assert action.dest == d.dest
            assert action.help.startswith(d.option.help)
            if not d.required:
                assert action.default == (None if d.option.unset else d.default)


def test_the_defaults_build_the_configs_defaults() -> None:
    args = build_parser().parse_args(["synth", "--dataset", "coco", "--out", "x"])
    config = build_config(args)
    assert config.selection == SelectionConfig()
    assert config.mask == MaskConfig()
    assert config.text == TextConfig()
    assert config.verify == VerifyConfig()
    assert config.detect is None
    assert (config.captions, config.seed, config.images_per_shard) == ("one", 0, 1000)
    assert config.max_pixels == SynthConfig().max_pixels and config.pairs is False
    assert build_runtime(args) == Runtime()
    assert ray_options(args) == RayOptions()


def test_options_reach_their_fields() -> None:
    argv = [
        "synth", "--dataset", "csv", "--root", "t.csv", "--out", "x",
        "--detector-model", "dm", "--detect-threshold", "0.3", "--detect-nms-iou", "1",
        "--detect-queries", "vocabulary", "--detect-max", "5", "--detect-template", "x {}",
        "--mask-source", "box", "--dilate", "3", "--alpha1", "0.3", "--seed", "4",
        "--no-verify-text", "--filter", "--verify-k", "3", "--verify-model", "vm",
        "--no-repair-captions", "--no-skip-unchanged-captions", "--captions-per-image", "all",
        "--samples-per-shard", "7", "--pairs", "--max-pixels", "99", "--image-method", "blur",
        "--device", "cuda:1", "--dtype", "float16", "--batch-size", "5", "--verify-shards",
        "--detect-batch-size", "2", "-v", "--no-dashboard", "--gpus-per-actor", "0.5",
        "--ray-address", "auto", "--in-flight", "4", "--place-timeout", "3",
    ]  # fmt: skip
    args = build_parser().parse_args(argv)
    config, runtime, ray = build_config(args), build_runtime(args), ray_options(args)
    assert config.detect == DetectConfig("dm", 0.3, 1.0, "vocabulary", "x {}", 5)
    assert config.mask == MaskConfig("box", 3)
    coco = build_parser().parse_args(["synth", "--out", "x", "--mask-source", "segmentation"])
    assert build_config(coco).mask.source == "segmentation"
    assert config.selection.alpha1 == 0.3 and config.seed == 4
    assert config.verify.mode == "filter" and config.verify.model == "vm"
    assert (config.verify.k, config.verify.text_check) == (3, False)
    assert (config.text.repair, config.text.skip_unchanged) == (False, False)
    assert (config.captions, config.images_per_shard, config.pairs) == ("all", 7, True)
    assert (config.max_pixels, config.image.method) == (99, "blur")
    assert (runtime.device, runtime.dtype, runtime.batch_size) == ("cuda:1", "float16", 5)
    assert (runtime.verify_shards, runtime.detect_batch_size) == (True, 2)
    assert (ray.verbose, ray.dashboard, ray.gpus_per_actor) == (True, False, 0.5)
    assert (ray.address, ray.in_flight, ray.place_timeout) == ("auto", 4, 3.0)


def test_skip_unchanged_left_unset_follows_the_boxes() -> None:
    parse = build_parser().parse_args
    detected = parse(["synth", "--dataset", "csv", "--root", "t.csv", "--out", "x"])
    assert detected.skip_unchanged_captions is None
    assert build_config(detected).text.skip_unchanged is True
    assert build_config(parse(["synth", "--out", "x"])).text.skip_unchanged is False


def test_train_lists_become_tuples_and_required_options_are_required() -> None:
    parse = build_parser().parse_args
    args = parse(["train", "--model", "m", "--original", "a", "b", "--out", "o"])
    config = train_config(args)
    assert (config.original, config.synthetic) == (("a", "b"), ())
    assert (config.epochs, config.grad_clip_norm) == (10, None)  # the clip recipe's
    with pytest.raises(SystemExit):
        parse(["train", "--original", "a", "--out", "o"])


def test_a_bad_value_is_refused_by_its_kind() -> None:
    parse = build_parser().parse_args
    for argv in (
        ["synth", "--detect-threshold", "1.5"],
        ["synth", "--alpha3", "1"],
        ["synth", "--gpus-per-actor", "9"],
        ["audit", "distractors", "--input", "i", "--pool", "p", "--output", "o",
         "--min-similarity", "2"],
    ):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(argv)


def test_eval_options_build_its_config() -> None:
    parse = build_parser().parse_args
    base = ["eval", "--queries", "q", "--model", "m", "--out", "o"]
    assert build(EvalConfig, parse(base)) == EvalConfig()
    args = parse([*base, "--ks", "1", "50", "--curve-k", "7", "--topk-device", "cuda:1"])
    assert build(EvalConfig, args) == EvalConfig(odmap_ks=(1, 50), curve_k=7, device="cuda:1")
    assert (args.device, args.batch_size) == (None, 64)  # the models', not top-k's
    with pytest.raises(SystemExit):
        parse([*base, "--ks", "0"])


def test_filter_captions_batch_size_builds_its_config() -> None:
    parse = build_parser().parse_args
    base = ["filter-captions", "--input", "i", "--output", "o"]
    assert build(FilterConfig, parse(base)) == FilterConfig()
    args = parse([*base, "--batch-size", "3"])
    verbs = frozenset({"VERB"})
    assert build(FilterConfig, args, verb_pos=verbs) == FilterConfig(verb_pos=verbs, batch_size=3)


@dataclass(frozen=True)
class _Toy:
    name: str = field(metadata=option("a name", metavar="NAME"))
    count: int = field(default=2, metadata=option("how many (%(default)s)", kind="positive_int"))
    tags: tuple[str, ...] = field(default=(), metadata=option("tags", nargs="*"))
    quiet: bool = field(
        default=True, metadata=option("talk", kind="no-flag", flags=("--loud",), dest="quiet")
    )
    hidden: int = 0


def test_declarations_of_a_toy_config() -> None:
    assert [d.field for d in declared(_Toy)] == ["name", "count", "tags", "quiet"]
    assert [d.field for d in declared(_Toy, "quiet", "name")] == ["quiet", "name"]
    with pytest.raises(ValueError, match="hidden"):
        declared(_Toy, "hidden")
    with pytest.raises(ValueError, match="kind 'integer'"):
        CliOption("x", kind="integer")
    parser = argparse.ArgumentParser()
    add_options(parser, declared(_Toy))
    args = parser.parse_args(["--name", "a", "--tags", "x", "y", "--loud"])
    assert build(_Toy, args) == _Toy("a", 2, ("x", "y"), False)
    assert build(_Toy, args, count=5).count == 5
    assert "how many (2)" in parser.format_help()


def _pair(text: str) -> tuple[str, str]:
    left, sep, right = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected A:B, got {text!r}")
    return left, right


@dataclass(frozen=True, kw_only=True)
class _Command:
    """A command's own options: every shape a command line needs beyond a config's."""

    src: Path = declare(help="the input", flags=("src",), kind="path", metavar="SRC")
    pair: list[tuple[str, str]] | None = declare(
        None, help="a pair (repeat)", parse=_pair, repeat=True
    )
    seen: list[str] = declare([], help="seen (repeat)", repeat=True)
    left: str = declare(help="one side", exclusive="side")
    right: int = declare(help="the other side", kind="int", exclusive="side")
    level: float | None = declare(0.5, help="a level", kind="float", exclusive="level")
    natural: None = declare(None, help="no level", kind="const", dest="level", exclusive="level")


@dataclass(frozen=True, kw_only=True)
class _Rest:
    flag: bool = declare(False, help="a flag", kind="flag")
    rest: list[str] = declare(help="after --: the rest", flags=("rest",), nargs="...")


def _command(cls: type = _Command) -> argparse.ArgumentParser:
    from counterfactual.cli import CliParser

    parser = CliParser(prog="toy")
    add_options(parser, declared(cls))
    return parser


def test_a_command_declares_positionals_repeats_exclusive_groups_and_consts() -> None:
    args = _command().parse_args(
        ["in.txt", "--pair", "a:b", "--pair", "c:d", "--right", "7", "--natural"]
    )
    assert args.src == Path("in.txt")
    assert args.pair == [("a", "b"), ("c", "d")]
    assert (args.right, args.left, args.level) == (7, None, None)
    assert args.seen == []
    args = _command().parse_args(["in.txt", "--left", "l", "--seen", "s"])
    assert (args.level, args.seen, args.pair) == (0.5, ["s"], None)
    assert _command().parse_args(["in.txt", "--left", "l"]).seen == []  # a fresh list each time
    usage = _command().format_usage()
    assert "(--left LEFT | --right RIGHT)" in usage  # required: one of them
    assert "[--level LEVEL | --natural]" in usage
    assert usage.rstrip().endswith("SRC")
    args = _command(_Rest).parse_args(["--flag", "--", "--x", "1"])
    assert (args.flag, args.rest) == (True, ["--", "--x", "1"])  # as models list takes them


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["in.txt"], "one of the arguments --left --right is required"),
        (["in.txt", "--left", "l", "--right", "1"], "--right: not allowed with argument --left"),
        (["in.txt", "--left", "l", "--level", "1", "--natural"], "not allowed with argument"),
        (["in.txt", "--left", "l", "--pair", "ab"], "argument --pair: expected A:B, got 'ab'"),
        (["in.txt", "--right", "x"], "argument --right: invalid int value: 'x'"),
        (["--left", "l"], "the following arguments are required: SRC"),
    ],
)
def test_a_command_declaration_refuses_as_argparse_does(argv, error, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        _command().parse_args(argv)
    assert stop.value.code == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("toy: error: ") and error in first


def test_the_library_holds_no_argparse() -> None:
    root = Path(__file__).resolve().parents[1]
    files = list((root / "counterfactual").rglob("*.py"))
    users = []
    for path in files:
        if "cli" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if "argparse" in names:
                users.append(str(path.relative_to(root)))
    assert users == []
