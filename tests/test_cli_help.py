"""``--help``: every option of every subcommand (``audit``'s nested ones too) says what it does
and shows its default: the value, or for an option that is unset by default (``None``, an
empty list) what happens then ("default: all", "default: not written"). Required options and
on/off switches are exempt."""

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from counterfactual.cli import SUBCOMMANDS, build_parser

FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction)
"""On/off switches: their default is "not given", which ``--help`` need not spell out."""


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every (nested) subcommand's parser, once each (aliases share one)."""
    seen: set[int] = set()
    todo = [parser]
    while todo:
        p = todo.pop(0)
        if id(p) in seen:
            continue
        seen.add(id(p))
        yield p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += list(action.choices.values())


def options() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    out = []
    for p in parsers(build_parser()):
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            out.append((f"{p.prog} {name}", p, action))
    return out


OPTIONS = options()


def shown_default(action: argparse.Action) -> list[str]:
    """The texts the rendered help must show after the word "default" (none: nothing to show)."""
    d = action.default
    if d is None or d is False or d == "" or d is argparse.SUPPRESS:
        return []
    if isinstance(action, FLAGS) and isinstance(d, bool):
        return []
    if isinstance(d, list | tuple):
        return [str(x) for x in d]  # an empty list is "none given"
    if isinstance(d, float) and d.is_integer():
        return [f"{d:g}"]  # 120.0 shown as 120
    return [str(d)]


def needs_default_word(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Whether the help of an option unset by default must still say what its default is:
    every option that takes a value, unless it is required (by argparse, as one of a required
    group, or in its own words: "(required)")."""
    if not action.option_strings or action.nargs == 0 or action.default is argparse.SUPPRESS:
        return False  # positionals, switches, --help-like actions
    if action.required or "required" in (action.help or ""):
        return False
    groups = parser._mutually_exclusive_groups
    return not any(g.required and action in g._group_actions for g in groups)


def shows(text: str, wanted: list[str]) -> bool:
    """Whether ``text`` names each of ``wanted`` after the word "default" (any case)."""
    if not wanted:
        return True
    at = text.lower().find("default")
    return at >= 0 and all(w in text[at:] for w in wanted)


def rendered(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as ``--help`` prints it (``%(default)s`` and the like filled in)."""
    return parser._get_formatter()._expand_help(action)


def test_every_subcommand_is_walked():
    progs = {p.prog for p in parsers(build_parser())}
    assert {"counterfactual synth", "counterfactual report", "counterfactual audit"} <= progs
    assert any(prog.startswith("counterfactual audit ") for prog in progs)
    assert len(OPTIONS) > 200


@pytest.mark.parametrize("name, parser, action", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_option_has_help_and_shows_its_default(name, parser, action):
    assert action.help and action.help is not argparse.SUPPRESS, f"{name}: no help text"
    text = " ".join(rendered(parser, action).split())
    assert len(text) >= 8, f"{name}: help too short: {text!r}"
    wanted = shown_default(action)
    if wanted:
        assert shows(text, wanted), f"{name}: default {action.default!r} not shown: {text!r}"
    elif needs_default_word(parser, action):
        assert "default" in text.lower(), f"{name}: unset by default, but says not what then"


@pytest.mark.parametrize(
    "rule, action, ok",
    [
        ("value", argparse.Action(["--x"], "x", default=3, help="x (default: %(default)s)"), True),
        ("written", argparse.Action(["--x"], "x", default=0.5, help="x (default 0.5)"), True),
        ("missing", argparse.Action(["--x"], "x", default=3, help="a number of things"), False),
        ("other", argparse.Action(["--x"], "x", default=3, help="x (default: 4)"), False),
        ("before", argparse.Action(["--x"], "x", default=3, help="3 things (default: all)"), False),
        ("none", argparse.Action(["--x"], "x", default=None, help="a number of things"), True),
        ("list", argparse.Action(["--x"], "x", default=[1, 5], help="ks (default 1 5)"), True),
        ("empty", argparse.Action(["--x"], "x", default=[], help="files, any number"), True),
        ("Default", argparse.Action(["--x"], "x", default="m", help="x. Default m, small"), True),
    ],
)
def test_the_rule_itself(rule, action, ok):
    parser = argparse.ArgumentParser()
    text = " ".join(rendered(parser, action).split())
    assert shows(text, shown_default(action)) is ok, rule


@pytest.mark.parametrize(
    "rule, action, ok",
    [
        ("unset, said", argparse.Action(["--x"], "x", help="files (default: all)"), True),
        ("unset, unsaid", argparse.Action(["--x"], "x", help="a number of things"), False),
        ("required", argparse.Action(["--x"], "x", required=True, help="a file"), True),
        ("own words", argparse.Action(["--x"], "x", help="a file (required)"), True),
        ("switch", argparse._StoreTrueAction(["--x"], "x", help="a switch"), True),
        ("empty list", argparse.Action(["--x"], "x", nargs="+", default=[], help="ks"), False),
    ],
)
def test_the_rule_for_options_unset_by_default(rule, action, ok):
    parser = argparse.ArgumentParser()
    text = " ".join(rendered(parser, action).split())
    said = not needs_default_word(parser, action) or "default" in text.lower()
    assert said is ok, rule


def test_help_prints_for_every_subcommand(capsys):
    for p in parsers(build_parser()):
        with pytest.raises(SystemExit) as exit_:
            p.parse_args(["--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage:"), p.prog


def _synth_help() -> str:
    (synth,) = (p for p in parsers(build_parser()) if p.prog == "counterfactual synth")
    return synth.format_help()


def test_synth_help_leads_with_the_options_most_runs_need():
    """The first group of ``synth --help`` holds the ten options of the README's recipes, in
    that order; each option is listed once, in one group; the usage line is short."""
    from counterfactual.cli.synth import LEAD

    text = _synth_help()
    usage, rest = text.split("\n\n", 1)
    assert usage.count("\n") == 0 and "--out OUT" in usage
    first = rest.split("\n\n")[1]  # after the description
    assert first.startswith("the options most runs need")
    # a boolean's line names both forms (``--verify, --no-verify``): its first names it
    shown = [
        line.split()[0].rstrip(",") for line in first.splitlines()[1:] if line.startswith("  --")
    ]
    assert shown == list(LEAD) and len(LEAD) == 10
    listed = [line.split()[0].rstrip(",") for line in text.splitlines() if line.startswith("  --")]
    assert len(listed) == len(set(listed))  # none twice
    assert {"--text-method", "--policy", "--pairs", "--dry-run"} <= set(listed)


def test_no_help_cites_an_internal_document():
    """No "SPEC 1.1" (a document the repository does not hold); SPEC as a metavar is fine."""
    for p in parsers(build_parser()):
        assert not re.search(r"SPEC \d", p.format_help()), p.prog


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_a_named_command_gets_the_parser_it_has_among_all(name):
    """``main`` builds only the parser of the command it is given: the same, to its help."""
    (alone,) = build_parser(name)._defaults["_subcommands"].values()
    among = build_parser()._defaults["_subcommands"][name]
    assert alone.format_help() == among.format_help()
    assert [p.format_help() for p in parsers(alone)] == [p.format_help() for p in parsers(among)]


def test_a_named_command_imports_no_other_commands_module():
    script = (
        "import sys\n"
        "from counterfactual.cli import main\n"
        "assert main(['--debug', 'configs']) == 0\n"
        "print(' '.join(m for m in sys.modules if m.startswith('counterfactual.cli.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    imported = set(done.stdout.splitlines()[-1].split())
    assert "counterfactual.cli.configs" in imported
    others = {f"counterfactual.cli.{n.replace('-', '_')}" for n in SUBCOMMANDS if n != "configs"}
    assert not imported & others, sorted(imported & others)
