"""counterfactual.messages: every line a person reads is one line, bounded, and cannot reorder
the terminal around it."""

from __future__ import annotations

import pytest

from counterfactual.messages import MAX_LINE, cut, one_line, short


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("two\nlines\r\n  and\ttabs ", "two lines and tabs"),
        ("A person\u202e beside a horse.", "A person\\u202e beside a horse."),
        ("\u2067evil\u2069.jpg", "\\u2067evil\\u2069.jpg"),
        ("left\u200fmark", "left\\u200fmark"),
        ("A ｐｅｒｓｏｎ", "A ｐｅｒｓｏｎ"),  # not a control: shown as it is
    ],
)
def test_one_line_joins_lines_and_escapes_bidi_controls(text, expected):
    assert one_line(text) == expected


def test_a_long_line_keeps_its_head_and_tail():
    text = "error: " + ", ".join(f"shard-{i:06d}.tar" for i in range(10_000)) + "; rerun it"
    line = one_line(text)
    assert len(line) == MAX_LINE
    assert line.startswith("error: shard-000000.tar, ")
    assert line.endswith("shard-009999.tar; rerun it")
    assert " ... " in line


@pytest.mark.parametrize("limit", [7, 8, 50])
def test_cut_never_exceeds_its_limit(limit):
    assert len(cut("x" * 1000, limit)) == limit
    assert cut("short", limit) == "short"


def test_cut_refuses_a_limit_too_small_for_the_ellipsis():
    with pytest.raises(ValueError, match="limit must be at least 7, got 3"):
        cut("anything", 3)


def test_short_quotes_a_value_on_one_line():
    assert short("a\nb") == "'a\\nb'"
    assert len(short(list(range(1000)))) == 80
