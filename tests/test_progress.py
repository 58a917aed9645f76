"""Progress lines and bars, timed by a fake clock (no sleeps, nothing timed)."""

from __future__ import annotations

import io

import pytest

from counterfactual import progress
from counterfactual.progress import Counts, Progress, format_line


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_line_with_known_total() -> None:
    counts = Counts(
        inputs=1234,
        total_inputs=3000,
        shards=3,
        total_shards=10,
        written=1100,
        skipped=120,
        failed=14,
    )
    # rate 1234 / 10 s = 123.4 images/s; ETA (3000 - 1234) / 123.4 = 14.3 s
    assert format_line(counts, 10.0) == (
        "synth: 1,234/3,000 images (41%), 3/10 shards, rows: 1,100 written, 120 skipped, 14 failed, "
        "123.4 images/s, ETA 0:00:14"
    )


def test_line_with_unknown_total_has_no_percent_or_eta() -> None:
    counts = Counts(inputs=1234, total_inputs=None, shards=3, total_shards=10, written=1100)
    line = format_line(counts, 10.0)
    assert line == (
        "synth: 1,234 images, 3/10 shards, rows: 1,100 written, 0 skipped, 0 failed, 123.4 images/s"
    )


@pytest.mark.parametrize(
    ("items", "total", "elapsed", "tail"),
    [
        (100, 100_100, 10.0, "10.0 images/s, ETA 2:46:40"),  # 100,000 left at 10/s
        (1, 3, 2.0, "0.5 images/s, ETA 0:00:04"),
        (2, 3, 2.0, "1.0 images/s, ETA 0:00:01"),
        (3, 3, 2.0, "1.5 images/s, ETA 0:00:00"),
        (5, 3, 2.0, "2.5 images/s, ETA 0:00:00"),  # more than the total: nothing left
        (0, 3, 2.0, "0.0 images/s"),  # no rate yet: no ETA
        (0, 3, 0.0, "0 failed"),  # no time yet: no rate
    ],
)
def test_rate_and_eta(items: int, total: int, elapsed: float, tail: str) -> None:
    line = format_line(Counts(inputs=items, total_inputs=total, total_shards=1), elapsed)
    assert line.endswith(tail), line


@pytest.mark.parametrize(
    ("items", "total", "percent"),
    [(0, 3000, "(0%)"), (2999, 3000, "(99%)"), (3000, 3000, "(100%)"), (0, 0, "(100%)")],
)
def test_percent_rounds_down(items: int, total: int, percent: str) -> None:
    assert percent in format_line(Counts(inputs=items, total_inputs=total), 1.0)


def test_final_line_says_elapsed_not_eta() -> None:
    line = format_line(Counts(inputs=70, total_inputs=100), 3725.0, final=True, label="run")
    assert line.startswith("run: 70/100 images (70%)")
    assert line.endswith(", 1:02:05 elapsed")
    assert "ETA" not in line


def test_plain_lines_at_the_interval() -> None:
    clock = FakeClock()
    out = io.StringIO()
    with Progress(10, 2, stream=out, interval=5.0, clock=clock) as p:
        assert p.bar is False
        clock.now = 101.0
        p.update(inputs=1, written=1)
        clock.now = 104.9
        p.update(inputs=1, skipped=1)
        assert out.getvalue() == ""  # less than 5 s since the start
        clock.now = 105.0
        p.update(inputs=2, written=2, shards=1)
        lines = out.getvalue().splitlines()
        assert lines == [
            "synth: 4/10 images (40%), 1/2 shards, rows: 3 written, 1 skipped, 0 failed, "
            "0.8 images/s, ETA 0:00:08"
        ]
        clock.now = 109.9
        p.update(inputs=1, failed=1)
        assert len(out.getvalue().splitlines()) == 1  # 4.9 s since the last line
        clock.now = 110.0
        p.update(inputs=5, written=5, shards=1)
        assert len(out.getvalue().splitlines()) == 2
        clock.now = 112.0
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[-1] == (
        "synth: 10/10 images (100%), 2/2 shards, rows: 8 written, 1 skipped, 1 failed, "
        "0.8 images/s, 0:00:12 elapsed"
    )
    assert p.counts == Counts(10, 10, 2, 2, 8, 1, 1)


def test_close_writes_the_final_line_once() -> None:
    clock = FakeClock()
    out = io.StringIO()
    p = Progress(None, 1, stream=out, clock=clock)
    clock.now += 4
    p.update(inputs=2)
    p.close()
    p.close()
    p.update(inputs=1)  # counted, not shown
    assert out.getvalue().splitlines() == [
        "synth: 2 images, 0/1 shards, rows: 0 written, 0 skipped, 0 failed, 0.5 images/s, 0:00:04 elapsed"
    ]
    assert p.counts.inputs == 3


def test_unknown_total_grows_by_delta() -> None:
    clock = FakeClock()
    out = io.StringIO()
    with Progress(None, 1, stream=out, interval=1.0, clock=clock) as p:
        clock.now += 1
        p.update(inputs=1)
        assert "images (" not in out.getvalue()  # unknown: no percentage
        assert "ETA" not in out.getvalue()
        p.update(total_inputs_delta=4)
        p.update(total_inputs_delta=4)
        assert p.counts.total_inputs == 8
        clock.now += 1
        p.update(inputs=1)
    assert "2/8 images (25%)" in out.getvalue().splitlines()[1]


def test_bar_on_a_terminal() -> None:
    pytest.importorskip("tqdm")
    out = Tty()
    with Progress(4, 2, stream=out, clock=FakeClock()) as p:
        assert p.bar is True
        p.update(inputs=2, written=1, skipped=1, shards=1)
        p.update(inputs=2, written=1, failed=1, shards=1)
    text = out.getvalue()
    assert "synth" in text
    assert "4/4" in text
    assert "2/2 shards, rows: 2 written, 1 skipped, 1 failed" in text
    assert "items/s, ETA" not in text  # no plain lines


def test_bar_grows_its_total() -> None:
    pytest.importorskip("tqdm")
    out = Tty()
    with Progress(None, 1, stream=out, clock=FakeClock()) as p:
        p.update(inputs=1, total_inputs_delta=3)
        assert p._tqdm is not None and p._tqdm.total == 3
        p.update(inputs=2)
    assert "3/3" in out.getvalue()


def test_bar_without_tqdm_rewrites_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_load_tqdm", lambda: None)
    clock = FakeClock()
    out = Tty()
    with Progress(4, 1, stream=out, clock=clock) as p:
        clock.now += 1
        p.update(inputs=2, written=2)
        clock.now += 1
        p.update(inputs=2, written=2, shards=1)
    text = out.getvalue()
    assert text.count("\r") == 3  # two updates and the final line
    assert text.endswith(
        "4/4 images (100%), 1/1 shards, rows: 4 written, 0 skipped, 0 failed, "
        "2.0 images/s, 0:00:02 elapsed\x1b[K\n"
    )
    assert text.count("\n") == 1


def test_bar_can_be_forced_either_way() -> None:
    assert Progress(1, 1, stream=Tty(), bar=False).bar is False
    assert Progress(1, 1, stream=io.StringIO(), bar=True).bar is True


@pytest.mark.parametrize("kwargs", [{"total_inputs": -1}, {"total_shards": -1}, {"interval": -0.5}])
def test_bad_configuration(kwargs: dict) -> None:
    args = {"total_inputs": 1, "total_shards": 1, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Progress(args.pop("total_inputs"), args.pop("total_shards"), stream=io.StringIO(), **args)


def test_items_are_counted_as_they_finish_before_their_shard_commits() -> None:
    """A worker reports the items a shard has finished so far; the latest report counts, a
    shard begun again (its worker was lost) starts from 0, and the commit's count replaces
    the reports: nothing twice, nothing after."""
    clock, out = FakeClock(), io.StringIO()
    with Progress(6, 2, stream=out, clock=clock, interval=0) as p:
        clock.now += 2
        p.shard_items(0, 2)
        p.shard_items(1, 3)
        assert p.counts.items == 5 and p.counts.shards == 0
        assert out.getvalue().splitlines()[-1] == (
            "synth: 0/6 images (0%), 0/2 shards, 5 items, rows: 0 written, 0 skipped, 0 failed, "
            "0.0 images/s, 2.5 items/s"
        )
        p.shard_items(1, 1)  # shard 1 begun again on another worker
        assert p.counts.items == 3
        p.update(inputs=3, written=4, shards=1, items=4, shard=0)  # shard 0 commits 4 items
        assert p.counts.items == 5
        p.shard_items(0, 3)  # a late report of a committed shard
        assert p.counts.items == 5
        p.update(inputs=3, written=2, shards=1, items=2, shard=1)
        assert p.counts.items == 6
    assert (
        out.getvalue()
        .splitlines()[-1]
        .startswith("synth: 6/6 images (100%), 2/2 shards, 6 items, rows: 6 written")
    )


def test_the_bar_shows_items_before_any_shard_commits() -> None:
    pytest.importorskip("tqdm")
    out, clock = Tty(), FakeClock()
    with Progress(4, 2, stream=out, clock=clock) as p:
        clock.now += 1
        p.shard_items(0, 7)
        assert "0/2 shards, 7 items, rows" in out.getvalue()


def test_the_in_process_runner_reports_items_after_every_batch(tmp_path) -> None:
    from counterfactual.image import ImageConfig
    from counterfactual.readers.coco import read_coco
    from counterfactual.readers.generate import generate_coco
    from counterfactual.synth.plan import Runtime, SynthConfig
    from counterfactual.synth.runner import run_local

    files = generate_coco(tmp_path / "coco", 12, seed=5, size=(160, 120))
    records = read_coco(files.instances, files.captions, files.images).records
    seen: list[tuple[str, int, int]] = []

    class Recording(Progress):
        def shard_items(self, shard: int, items: int) -> None:
            seen.append(("partial", shard, items))
            super().shard_items(shard, items)

        def update(self, *args, shard=None, items=0, **kwargs) -> None:
            if shard is not None:
                seen.append(("commit", shard, items))
            super().update(*args, shard=shard, items=items, **kwargs)

    config = SynthConfig(image=ImageConfig(method="blur"), images_per_shard=4)
    with Recording(len(records), 3, stream=io.StringIO()) as p:
        result = run_local(
            records, tmp_path / "out", config, progress=p, runtime=Runtime(batch_size=1)
        )
    assert p.counts.items == result.items > 0
    for shard in range(3):
        events = [(e, n) for e, s, n in seen if s == shard]
        partial = [n for e, n in events if e == "partial"]
        assert events[-1][0] == "commit" and partial == list(range(1, events[-1][1] + 1))
