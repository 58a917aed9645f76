"""Erasers and rewriters declare their options as every config does (``options.declare`` on
their config's fields): the command line and the YAML configs follow from the declarations
with the flags and keys they had, and runs record what they recorded (the text options in
format 2's order, whatever order ``--help`` shows them in). The refusals as a user meets them
(the real command, a process)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from counterfactual.cli import build_parser
from counterfactual.image import ERASERS, cli_options
from counterfactual.options import declared
from counterfactual.synth.plan import SynthConfig
from counterfactual.text import TextConfig
from counterfactual.text.base import RECORD_ORDER, TextOptions


def _synth_parser():
    parser = build_parser()
    return parser._subparsers._group_actions[0].choices["synth"]  # type: ignore[union-attr]


def test_each_eraser_option_is_its_config_fields_declaration() -> None:
    """The synth parser holds each declared field of each eraser's config once, under the key
    a YAML config names it by (the flag's name), unset until given."""
    actions = {a.option_strings[0]: a for a in _synth_parser()._actions if a.option_strings}
    seen = set()
    for eraser in ERASERS.values():
        for d in declared(eraser.config):
            action = actions[d.flags[0]]
            assert action.dest == d.flags[0][2:].replace("-", "_")
            assert action.default is None
            seen.add(d.flags[0])
    assert seen == {d.flags[0] for d in cli_options().values()}
    assert len(seen) == 20


def test_the_shared_keys_are_declared_alike_by_every_backend_that_has_them() -> None:
    """``--inpaint-model`` and ``--feather`` are fields of diffusers and LaMa, one option."""
    by_flag: dict[str, set[tuple[str, str]]] = {}
    for eraser in ERASERS.values():
        for d in declared(eraser.config):
            by_flag.setdefault(d.flags[0], set()).add((d.option.help, d.option.kind))
    assert {f for f, specs in by_flag.items() if len(specs) != 1} == set()
    owners = {
        flag: [e.name for e in ERASERS.values() if flag in [d.flags[0] for d in declared(e.config)]]
        for flag in ("--inpaint-model", "--feather")
    }
    assert owners == {"--inpaint-model": ["diffusers", "lama"], "--feather": ["diffusers", "lama"]}


def test_the_text_options_are_recorded_in_format_2s_order() -> None:
    """Declared in ``--help``'s order, recorded in format 2's: the manifest's bytes stay."""
    assert [f.name for f in fields(TextConfig)] == [
        "method",
        "model",
        "spacy_model",
        "skip_unchanged",
        "repair",
        "max_new_tokens",
        "num_beams",
    ]
    assert TextConfig().to_dict() == {
        "method": "np-removal",
        "spacy_model": None,
        "repair": True,
        "skip_unchanged": False,
        "model": "Salesforce/blip-image-captioning-base",
        "max_new_tokens": 30,
        "num_beams": 3,
    }
    assert list(TextConfig().to_dict()) == list(RECORD_ORDER)
    text = SynthConfig(text=TextConfig(method="prompt")).to_dict()["text"]
    assert list(text) == ["method", "spacy_model", "vocabulary", *RECORD_ORDER[2:]]
    assert text["method"] == "prompt"


def test_the_text_group_lists_every_declared_text_option() -> None:
    """The help's text group: TextConfig's declarations in field order, the vocabulary after
    the spaCy model, the captions per image last."""
    group = next(g for g in _synth_parser()._action_groups if g.title == "text")
    shown = [a.option_strings[0] for a in group._group_actions]
    text = [d.flags[0] for d in declared(TextConfig)]
    assert shown == [*text[:3], "--vocabulary", *text[3:], "--captions-per-image"]
    assert text == [
        "--text-method",
        "--captioner-model",
        "--spacy-model",
        "--skip-unchanged-captions",
        "--repair-captions",
    ]


def test_a_rewriter_reads_the_options_a_config_holds() -> None:
    """The rewriters take :class:`TextOptions`; a :class:`TextConfig` is one, checked."""
    assert issubclass(TextConfig, TextOptions)
    assert TextOptions().to_dict() == TextConfig().to_dict()
    with pytest.raises(ValueError, match="text method 'poem' is not one of"):
        TextConfig(method="poem")


def _synth(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", "synth", "--dataset", "demo", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("argv", "config", "line"),
    [
        (
            ("--exemplar-patch", "0"),
            "",
            "counterfactual synth: error: argument --exemplar-patch: 0 is not a whole number > 0",
        ),
        (
            ("--inpaint-recipe", "bogus"),
            "",
            "counterfactual synth: error: argument --inpaint-recipe: invalid choice: 'bogus' "
            "(choose from 'rorem', 'sdxl')",
        ),
        (
            ("--inpaint-backend", "exemplar", "--exemplar-patch", "4"),
            "",
            "counterfactual synth: error: exemplar_patch must be odd and >= 3, got 4",
        ),
        (
            (),
            "image_method: blur\nblur_sigma: 3\nlama_work_side: 12\n",
            "counterfactual synth: error: lama_work_side must be 0 or a multiple of 8 >= 64, "
            "got 12",
        ),
    ],
    ids=["flag-range", "flag-choice", "config-check", "yaml-key"],
)
def test_a_bad_eraser_option_is_one_line(argv, config, line, tmp_path) -> None:
    """A declared eraser option refused by its kind or choices (argparse), by its config's
    check, or from a YAML config by the key it always had: one line, exit 2, nothing written."""
    if config:
        (tmp_path / "run.yaml").write_text(config)
        argv = ("--config", "run.yaml", *argv)
    proc = _synth("--out", "out", *argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0] == line
    assert not (tmp_path / "out").exists()
