"""The text methods as they declare themselves (:data:`counterfactual.text.REWRITERS`): the
names, the help, the rewriter built and the verifier's text check all follow from the
declarations."""

from __future__ import annotations

import subprocess
import sys

import pytest

from counterfactual.method import verify
from counterfactual.options import declared
from counterfactual.text import (
    REMOVING_METHODS,
    REWRITERS,
    TEXT_METHODS,
    Rewriter,
    TextConfig,
    make_rewriter,
    text_model,
)


def test_the_methods_come_from_the_declarations() -> None:
    assert TEXT_METHODS == ("np-removal", "prompt", "captioner", "shuffle", "nouns-adj")
    assert REMOVING_METHODS == ("np-removal", "prompt", "captioner")
    assert REWRITERS["shuffle"] is REWRITERS["nouns-adj"]


def test_the_verifier_checks_the_methods_that_declare_it() -> None:
    # method/ comes before text/ and keeps its own tuples: they must say what text/ declares
    assert verify.TEXT_CHECKED == tuple(n for n, r in REWRITERS.items() if r.removes)
    assert verify.KEPT_NAMED == tuple(n for n, r in REWRITERS.items() if r.names_kept)


def test_the_help_names_every_method_once() -> None:
    (method,) = [d for d in declared(TextConfig) if d.field == "method"]
    assert method.option.choices == TEXT_METHODS
    for rewriter in dict.fromkeys(REWRITERS.values()):
        phrase = f"{', '.join(rewriter.names)}: {rewriter.summary}"
        assert method.option.help.count(phrase) == 1


def test_a_method_module_loads_only_when_chosen() -> None:
    """Only ``text/base.py`` (the request, result and options every rewriter shares) loads
    with the registry; a method's module when it is chosen."""
    code = (
        "import sys\n"
        "from counterfactual.text import RewriteRequest, TextConfig, make_rewriter\n"
        "loaded = [m for m in sys.modules if m.startswith('counterfactual.text.')]\n"
        "assert loaded == ['counterfactual.text.base'], loaded\n"
        "rewriter = make_rewriter(TextConfig(method='prompt'))\n"
        "(result,) = rewriter([RewriteRequest('a dog on a sofa', ('dog',), ('couch',))])\n"
        "print(rewriter.describe()['method'], result.text)\n"
        "print(sorted(m for m in sys.modules if m.startswith('counterfactual.text.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith("prompt ") and "couch" in out[0]
    assert out[1] == "['counterfactual.text.base', 'counterfactual.text.prompts']"


def test_each_name_is_served_by_its_declaration() -> None:
    shuffled = make_rewriter(TextConfig(method="shuffle"))
    assert shuffled.describe()["method"] == "shuffle"


def test_a_declaration_is_checked() -> None:
    with pytest.raises(ValueError, match="serves no --text-method name"):
        Rewriter((), "nothing", REWRITERS["prompt"].build)
    with pytest.raises(ValueError, match="names_kept needs removes"):
        Rewriter(("x",), "x", REWRITERS["prompt"].build, names_kept=True)


def test_an_unknown_method_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="text method 'rot13' is not one of"):
        TextConfig(method="rot13")


def test_the_model_a_method_loads_is_its_declared_field() -> None:
    assert text_model(TextConfig(method="captioner", model="my/blip")) == "my/blip"
    assert [n for n in TEXT_METHODS if text_model(TextConfig(method=n)) is not None] == [
        "captioner"
    ]
    assert [n for n, r in REWRITERS.items() if r.reads_image] == ["captioner"]
