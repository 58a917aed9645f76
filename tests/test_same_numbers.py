"""The same numbers on every machine: the alpha rules' areas are exact (integers on a snapping
grid), so plans and shards are byte-identical whatever the BLAS kernel, numpy's and OpenCV's SIMD
dispatch, the thread count and the batch composition; checked in-process against an exact
rational reference and across kernels in child processes."""

from __future__ import annotations

import hashlib
import json
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from one_child import main_in_one_child

import counterfactual.method.selection as selection
from counterfactual.boxtable import SNAP_BITS, BoxTable, snap_bits, snap_bits_of
from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.method.geometry import at_least, exceeds, union_area
from counterfactual.method.selection import SelectionConfig, candidates_table, select_table
from counterfactual.records import ImageRecord, ObjectAnnotation

REPO = Path(__file__).resolve().parents[1]


def coco_like_table(n=400, seed=3, width=640, height=480) -> BoxTable:
    """Boxes with two decimals, as COCO writes them, many overlapping and many at the edges."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        objects = []
        for _ in range(int(rng.integers(1, 12))):
            x, y = rng.uniform(-20, width), rng.uniform(-20, height)
            w, h = rng.uniform(0, width / 2), rng.uniform(0, height / 2)
            box = tuple(round(float(v), 2) for v in (x, y, w, h))
            objects.append(ObjectAnnotation(box, str(rng.choice(list("abcdef")))))
        records.append(ImageRecord(str(i), f"{i}.jpg", width, height, tuple(objects), ()))
    return BoxTable.from_records(records)


# ---- an exact reference: rational arithmetic on the snapped coordinates ----------------------


def _snapped_boxes(table: BoxTable, i: int) -> dict[str, list[tuple[Fraction, ...]]]:
    bits = snap_bits_of(table.width[i], table.height[i])
    scale = 2**bits
    out: dict[str, list[tuple[Fraction, ...]]] = {}
    for j in np.flatnonzero(table.owner == i).tolist():
        x, y, w, h = table.bbox[j].tolist()
        x0, x1 = min(max(x, 0.0), table.width[i]), min(max(x + w, 0.0), table.width[i])
        y0, y1 = min(max(y, 0.0), table.height[i]), min(max(y + h, 0.0), table.height[i])
        box = tuple(Fraction(round(v * scale), scale) for v in (x0, y0, x1, y1))
        if box[2] > box[0] and box[3] > box[1]:
            out.setdefault(table.classes[table.category[j]], []).append(box)
    return out


def _area(boxes, within=None) -> Fraction:
    """Exact area of the union of ``boxes``, intersected with the union of ``within``."""
    every = boxes + (within or [])
    xs = sorted({b[0] for b in every} | {b[2] for b in every})
    ys = sorted({b[1] for b in every} | {b[3] for b in every})
    total = Fraction(0)
    for x0, x1 in zip(xs, xs[1:], strict=False):
        for y0, y1 in zip(ys, ys[1:], strict=False):
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2

            def inside(bs, cx=cx, cy=cy):
                return any(b[0] < cx < b[2] and b[1] < cy < b[3] for b in bs)

            if inside(boxes) and (within is None or inside(within)):
                total += (x1 - x0) * (y1 - y0)
    return total


def exact_rules(table: BoxTable, i: int, config: SelectionConfig) -> dict[str, tuple]:
    classes = _snapped_boxes(table, i)
    if len(classes) < 2:
        return {}
    a1, a2, a3 = (Fraction(repr(a)) for a in (config.alpha1, config.alpha2, config.alpha3))
    area = {c: _area(b) for c, b in classes.items()}
    image = Fraction(int(table.width[i] * table.height[i]))
    out = {}
    for r in classes:
        co = {c: _area(classes[c], classes[r]) / area[c] for c in classes if c != r}
        removed = {r} | {c for c, v in co.items() if v > a2}
        union = [b for c in removed for b in classes[c]]
        kept = [c for c in classes if c not in removed]
        keep = {k: _area(classes[k], union) / area[k] for k in kept}
        fraction = _area(union) / image
        if not kept:
            why = "nothing-kept"
        elif max(keep.values()) >= a1:
            why = "keep-overlap"
        elif fraction >= a3:
            why = "too-large"
        else:
            why = None
        out[r] = (why, sorted(removed), co, keep, fraction)
    return out


def test_every_decision_and_ratio_equals_exact_rational_arithmetic():
    table = coco_like_table(n=150)
    config = SelectionConfig(alpha1=0.3, alpha2=0.6, alpha3=0.5)
    checked = 0
    for i, selection_ in enumerate(candidates_table(table, config)):
        expected = exact_rules(table, i, config)
        got = {c.target: c for c in selection_.candidates}
        assert got.keys() == expected.keys()
        for target, (why, removed, co, keep, fraction) in expected.items():
            plan = got[target]
            assert (plan.rejected_by, sorted(plan.removed)) == (why, removed)
            # each stored ratio is the exact ratio, correctly rounded (one division)
            assert plan.co_removal == {c: float(v) for c, v in co.items()}
            assert plan.keep_overlap == {k: float(v) for k, v in keep.items()}
            assert plan.removed_fraction == float(fraction)
            checked += 1
    assert checked > 300


def test_ratios_never_exceed_one_and_nested_boxes_give_exactly_one():
    table = coco_like_table(n=300, seed=11)
    for s in candidates_table(table, SelectionConfig()):
        for plan in s.candidates:
            ratios = [*plan.co_removal.values(), *plan.keep_overlap.values()]
            assert all(0.0 <= r <= 1.0 for r in ratios)
            assert 0.0 < plan.removed_fraction <= 1.0
    # the demo's dining table: a box inside another has co-removal 1.0, not 1.0000000000000002
    inner = ObjectAnnotation((100.37, 50.11, 20.53, 30.29), "cup")
    outer = ObjectAnnotation((90.1, 40.7, 300.33, 200.01), "dining table")
    record = ImageRecord("t", "t.jpg", 640, 480, (inner, outer), ())
    (only,) = candidates_table(BoxTable.from_records([record]), SelectionConfig())
    plans = {p.target: p for p in only.candidates}
    assert plans["dining table"].co_removal == {"cup": 1.0}


def _per_image(selections) -> list[str]:
    return [json.dumps([p.to_dict() for p in s.plans]) for s in selections]


def test_plans_do_not_depend_on_batch_composition(monkeypatch):
    table = coco_like_table(n=300, seed=5)
    config = SelectionConfig(policy="all")
    whole = _per_image(select_table(table, config))
    alone = [_per_image(select_table(table.images(i, i + 1), config))[0] for i in range(len(table))]
    assert whole == alone
    # images in another order: the same plan for each image
    order = np.random.default_rng(0).permutation(len(table)).tolist()
    shuffled = _per_image(
        select_table(BoxTable.from_records([_record(table, i) for i in order]), config)
    )
    assert [dict(zip(order, shuffled, strict=True))[i] for i in range(len(table))] == whole
    # tiny chunks (other padding, other product shapes) give the same bits
    monkeypatch.setattr(selection, "_CHUNK_CELLS", 1)
    assert _per_image(select_table(table, config)) == whole


def _record(table: BoxTable, i: int) -> ImageRecord:
    rows = np.flatnonzero(table.owner == i).tolist()
    objects = tuple(
        ObjectAnnotation(tuple(table.bbox[j].tolist()), table.classes[table.category[j]])
        for j in rows
    )
    return ImageRecord(
        table.image_ids[i], "x.jpg", int(table.width[i]), int(table.height[i]), objects, ()
    )


def test_ties_with_alpha_are_decided_on_the_exact_fraction():
    # 4/5 rounds to the float 0.8 and equals the decimal 0.8: not more, but at least
    assert not exceeds(np.array([4.0]), np.array([5.0]), 0.8)[0]
    assert at_least(np.array([4.0]), np.array([5.0]), 0.8)[0]
    # a fraction a hair above 0.123456789 that rounds to the same float: the exact test says
    # more, where comparing the rounded ratio would say equal
    alpha = 0.123456789
    exact = Fraction(repr(alpha))
    p, q = exact.numerator, exact.denominator
    den = next(d for d in range(2**51, 2**51 + 10**6) if (p * d // q + 1) / d == alpha)
    num = p * den // q + 1
    assert num / den == alpha and Fraction(num, den) > exact
    assert exceeds(np.array([float(num)]), np.array([float(den)]), alpha)[0]
    assert not exceeds(np.array([float(num - 1)]), np.array([float(den)]), alpha)[0]


def test_snapping_bound_and_huge_images():
    assert SNAP_BITS == 8
    # every edge moves by at most half a unit: 1/512 px
    assert union_area([[0.001, 0.001, 10.0, 10.0]]) == 100.0
    assert union_area([[0.5, 0.25, 1.125, 2.0]]) == pytest.approx(0.625 * 1.75, abs=0)
    sizes = [(640.0, 480.0), (2.0**18 - 1, 2.0**18 - 1), (2.0**18, 2.0**18), (2.0**26, 2.0**26)]
    bits = snap_bits(np.array([w for w, _ in sizes]), np.array([h for _, h in sizes]))
    assert bits.tolist() == [8, 8, 7, 0]
    assert [snap_bits_of(w, h) for w, h in sizes] == bits.tolist()


def test_pmi_is_computed_in_exact_arithmetic():
    counts = np.array([[7, 3, 0], [3, 5, 1], [0, 1, 2]], dtype=np.int64)
    stats = CooccurrenceStats(("a", "b", "c"), counts, 11)
    pmi = stats.pmi(1.0)
    import math

    for a in range(3):
        for b in range(3):
            exact = Fraction(int(counts[a, b]) + 1) / (
                Fraction(int(counts[a, a] * counts[b, b]), 11) + 1
            )
            assert pmi[a, b] == pytest.approx(math.log(exact), rel=1e-15)
    assert np.isneginf(stats.pmi(0.0)[0, 2])


# ---- across kernels, in child processes --------------------------------------------------------


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _numpy_dispatch() -> str:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))


def kernels() -> dict[str, dict[str, str]]:
    """The machine's own settings, each OpenBLAS kernel it can run, numpy's and OpenCV's SIMD
    dispatch switched off, and one thread."""
    out = {
        "default": {},
        "Haswell": {"OPENBLAS_CORETYPE": "Haswell"},
        "Prescott": {"OPENBLAS_CORETYPE": "Prescott"},
        "no-simd-dispatch": {
            "NPY_DISABLE_CPU_FEATURES": _numpy_dispatch(),
            "OPENCV_CPU_DISABLE": "AVX512_SKX,AVX512F,AVX2,FMA3,AVX,POPCNT,SSE4_2,SSE4_1,SSSE3",
        },
        "one-thread": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    }
    if "avx512f" in _cpu_flags():
        out["SkylakeX"] = {"OPENBLAS_CORETYPE": "SkylakeX"}
    if "avx2" not in _cpu_flags():
        del out["Haswell"]
    return out


def _run(runs: list[list[str]], env_extra: dict[str, str], cwd: Path) -> None:
    """The CLI commands ``runs``, in turn, in one child process started under ``env_extra``:
    the kernel settings are read at interpreter start, so one child per kernel."""
    env = {**os.environ, **env_extra, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    codes, stderr = main_in_one_child(runs, env, cwd)
    assert codes == [0] * len(runs), stderr[-3000:]


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def coco_file(tmp_path_factory) -> Path:
    """An instances file at COCO statistics with two-decimal coordinates."""
    from counterfactual.readers.generate import generate_coco

    root = tmp_path_factory.mktemp("kernels")
    files = generate_coco(root, 800, seed=4, write_images=False)
    data = json.loads(Path(files.instances).read_text())
    rng = np.random.default_rng(1)
    for ann in data["annotations"]:
        ann["bbox"] = [round(v + float(rng.uniform(-0.5, 0.5)), 2) for v in ann["bbox"]]
    path = root / "instances.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow
def test_select_writes_the_same_bytes_under_every_kernel(coco_file, tmp_path):
    digests = {}
    for name, env in kernels().items():
        runs = []
        for policy in ("all", "spurious"):
            out = tmp_path / name / f"{policy}.jsonl"
            out.parent.mkdir(exist_ok=True)
            args = ["select", "--annotations", str(coco_file), "--policy", policy, "--rejected"]
            runs.append([*args, "--out", str(out), "--workers", "1"])
        _run(runs, env, tmp_path)
        for policy in ("all", "spurious"):
            digests[(name, policy)] = _digest([tmp_path / name / f"{policy}.jsonl"])
    for policy in ("all", "spurious"):
        seen = {name: d for (name, p), d in digests.items() if p == policy}
        assert len(set(seen.values())) == 1, seen


@pytest.mark.slow
def test_synth_writes_the_same_shards_under_every_kernel(tmp_path):
    digests = {}
    for name, env in kernels().items():
        args = ["synth", "--dataset", "demo", "--runner", "local", "--policy", "all"]
        runs = [
            [*args, "--image-method", method, "--out", str(tmp_path / f"{name}-{method}")]
            for method in ("inpaint", "mean", "blur")
        ]
        _run(runs, env, tmp_path)
        for method in ("inpaint", "mean", "blur"):
            out = tmp_path / f"{name}-{method}"
            files = sorted(out.glob("shard-*.tar")) + [out / "status.jsonl"]
            assert len(files) > 1
            digests[(name, method)] = _digest(files)
    for method in ("inpaint", "mean", "blur"):
        seen = {name: d for (name, m), d in digests.items() if m == method}
        assert len(set(seen.values())) == 1, seen
