"""The whole loop on the controlled world, through the library functions the project's commands
call (each step's config a dataclass, so a renamed option fails where the config is built):

1. ``counterfactual world``: the dataset (train co-occurrence ``cooccurrence``, balanced test);
   the train split's image-caption pairs as WebDataset shards (D, shuffled);
2. ``counterfactual synth`` (:func:`~counterfactual.synth.runner.run_local`) on the train split (the paper's alpha rules, an eraser without
   weights, ``np-removal``): D'; and on the test split: the ODmAP@k queries;
3. the clean queries: each query's scene drawn again without its removed classes, in the same
   shards with the picture swapped (a gain that only the pipeline's queries show would be the
   model reading the eraser's traces);
4. per seed, ``counterfactual train --recipe scratch``
   (:func:`~counterfactual.train.trainer.fine_tune`) from the same initial weights, the same
   steps and seed, on D (arm ``D``) and on D ∪ D' (arm ``D+D'``: D' drawn at ``ratio`` per
   original sample, by default 1: at D''s natural ratio, about 0.19, the gain is a third as
   large; ``ratio=None`` draws it so);
5. ``counterfactual eval`` (:func:`~counterfactual.eval.run.run_eval`) of both arms on both query sets (R@K on the test split), with the
   gallery's hubness on the pipeline's queries.

Two optional studies share the world, the queries and arm D (one ``eval`` scores every model):

* the ratio sweep (``ratios``, the paper's Figure 4): one arm per ratio R = |D'_sub| / |D| on
  D ∪ D'_sub, D'_sub the first R·|D| samples of a seeded permutation of D' made with every
  caption rewritten (``synth --captions-per-image all``, about 0.95·|D|: so nested, R = 0.2 is
  about one caption per counterfactual picture), drawn at R per original sample; R = 0 is arm D;
* the grid (``image_methods`` x ``text_methods``, the paper's Table 3): one D' per cell, each
  arm trained as D+D' is; every cell scored on the same queries (the base ``image_method``'s)
  and the same clean renders.

:func:`run_experiment` writes ``OUT/results.json`` (``{"config", "arms": {"D", "D+D'"}}``, each
arm ``{"mean", "std", "seeds"}`` of :data:`METRICS` as fractions; ``"by_role"``: ODmAP@k per arm
over the queries of each removed-class role, :data:`ROLES`; ``"sweep"``: ``[{"ratio", "samples",
"arm"}]``; ``"grid"``: ``[{"image_method", "text_method", "synthetic", "arm"}]``),
``OUT/results.png`` (ODmAP@k per arm, error bars: the std over seeds; with a sweep,
``OUT/sweep.png``, the curve) and ``OUT/results.md``. The world, D and the synth runs
are made once (from ``seed``); seeds vary the model's initial weights and the data order.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import shutil
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from counterfactual.draws import keyed_int
from counterfactual.eval.run import EvalRun
from counterfactual.imageio import encode_jpeg
from counterfactual.options import declare
from counterfactual.readers.spec import DataSpec
from counterfactual.synth.plan import SynthConfig
from counterfactual.world.classes import PAIRS
from counterfactual.world.scene import CAPTION_STYLES, WorldConfig
from counterfactual.world.write import (
    COCO_SET,
    JPEG_QUALITY,
    World,
    read_world,
    write_original_shards,
    write_world,
)

if TYPE_CHECKING:
    from counterfactual.train.config import TrainConfig

ARMS = ("D", "D+D'")
KS = (1, 5, 10)
HUBNESS = (*(f"hub_skew@{k}" for k in KS), "hub_top1")
"""The gallery's hubness on the pipeline's queries: the k-occurrence skewness at k (any real
number; 0: every caption retrieved as often) and the largest share of queries whose top-1 is
one caption (a fraction)."""
METRICS = (
    *(f"odmap@{k}" for k in KS),
    *(f"clean_odmap@{k}" for k in KS),
    *(f"i2t_r@{k}" for k in KS),
    *(f"t2i_r@{k}" for k in KS),
    *HUBNESS,
)
"""The numbers of one arm and seed, fractions in [0, 1] but the skewness ``hub_skew@k``."""
TEXT_METHODS = ("np-removal", "prompt")
NO_CAPTIONER = (
    "the captioner text method needs a trained captioning model, which this offline world has "
    "not (a randomly initialised one writes noise, and training one is beyond the budget)"
)
ROLES = ("partner", "anchor", "unpaired", "several")
"""What a query's removed class is in the world: the co-occurring partner of a pair (the
shortcut: its anchor stays in the picture and suggests it), the anchor of a pair, a class of no
pair; ``several``: a query that removed more than one class."""
ROLE_METRICS = (*(f"odmap@{k}" for k in KS), *(f"clean_odmap@{k}" for k in KS))
IMAGE_METHODS = ("inpaint", "zero", "blur", "mean")
SWEEP_SHARD = 1000
"""Samples per shard of a sweep's D'_sub."""
POLICIES = ("uniform", "spurious", "all")
CONTACT_SHEET = 4
"""Rows of each synth run's ``contact_sheet.png``."""


@dataclass(frozen=True)
class ExperimentConfig:
    """The experiment's options; checked on construction. ``ratio``: D' per original sample in
    the D ∪ D' arm (None: the natural ratio). ``seeds`` runs seeds ``seed``,
    ``seed + 1``, ...; ``steps`` optimizer steps of ``batch_size`` per arm; ``world``: the world's
    knobs (its ``cooccurrence``, ``seed`` and ``caption_style`` are this config's).
    ``ratios``: the sweep's |D'_sub| / |D| (0: arm D), each >= 0; ``image_methods`` and
    ``text_methods``: the grid's (either alone: the other is the base method)."""

    seeds: int = declare(3, help="seeds S, S+1, ... (default: %(default)s)", kind="positive_int")
    seed: int = declare(
        0,
        help="S: the world's, synth's and the first training seed (default: %(default)s)",
        kind="nonnegative_int",
    )
    cooccurrence: float = declare(
        0.9, help="p(partner | anchor) in train, in [0.5, 1) (default: %(default)s)", kind="float"
    )
    steps: int = declare(
        1500, help="training steps per arm (default: %(default)s)", kind="positive_int"
    )
    batch_size: int = declare(128, help="(default: %(default)s)", kind="positive_int")
    lr: float = 2e-3
    device: str = declare("cpu", help="torch device (default: %(default)s)")
    text_method: str = declare(
        "np-removal", help="synth's (default: %(default)s)", choices=TEXT_METHODS
    )
    image_method: str = declare(
        "inpaint", help="synth's; inpaint is OpenCV's (default: %(default)s)", choices=IMAGE_METHODS
    )
    captions_per_image: str = "one"
    policy: str = declare(
        "uniform",
        help="synth's plan policy on the train split (the queries: uniform) (default: %(default)s)",
        choices=POLICIES,
    )
    partner_contrast: float | None = declare(
        None,
        help="contrast of the partner classes in (0, 1] (default: the world's, 0.65): how hard "
        "the co-occurring object is to see",
        kind="positive_float",
    )
    ratio: float | None = declare(
        1.0,
        help="D' drawn at this many per original sample (train --mix ratio) (default: %(default)s)",
        kind="positive_float",
    )
    images: int = declare(
        6000, help="scenes in the world (default: %(default)s)", kind="positive_int"
    )
    test: int = declare(
        700, help="test scenes, the queries' source (default: %(default)s)", kind="positive_int"
    )
    channels: tuple[int, ...] = (16, 32, 64)
    ratios: tuple[float, ...] = ()
    image_methods: tuple[str, ...] = ()
    text_methods: tuple[str, ...] = ()
    caption_style: str = declare(
        "list",
        help="the world's captions: list (classes listed, with relations and places) or "
        "sentences (with verbs: phrases np-removal can cut) (default: %(default)s)",
        choices=CAPTION_STYLES,
        flags=("--caption-style",),
    )
    threads: int = declare(1, help="torch CPU threads (default: %(default)s)", kind="positive_int")
    workers: int = declare(
        1,
        help="train's DataLoader workers: pictures decoded beside the training step; 0 and 1 "
        "train the same weights, 2 or more shuffle in each worker and train others "
        "(default: %(default)s)",
        kind="nonnegative_int",
    )

    def __post_init__(self) -> None:
        for name in ("seeds", "steps", "batch_size", "images", "test", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {self.workers!r}")
        if self.text_method == "captioner":
            raise ValueError(f"text_method: {NO_CAPTIONER}")
        if self.text_method not in TEXT_METHODS:
            raise ValueError(f"text_method must be one of {TEXT_METHODS}, got {self.text_method!r}")
        if self.image_method not in IMAGE_METHODS:
            raise ValueError(
                f"image_method must be one of {IMAGE_METHODS}, got {self.image_method!r}"
            )
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.ratio is not None and not self.ratio > 0:
            raise ValueError(f"ratio must be > 0 or None (natural), got {self.ratio!r}")
        if self.captions_per_image not in ("one", "all"):
            raise ValueError(
                f"captions_per_image must be one or all, got {self.captions_per_image!r}"
            )
        self._check_studies()
        _ = self.world  # checks the world's knobs

    def _check_studies(self) -> None:
        for r in self.ratios:
            if isinstance(r, bool) or not isinstance(r, int | float) or not 0 <= r < math.inf:
                raise ValueError(f"ratios must be finite numbers >= 0, got {r!r}")
        if len(set(self.ratios)) != len(self.ratios):
            raise ValueError(f"ratios repeat: {list(self.ratios)}")
        for m in self.image_methods:
            if m not in IMAGE_METHODS:
                raise ValueError(f"image_methods: {m!r} is not one of {IMAGE_METHODS}")
        for m in self.text_methods:
            if m == "captioner":
                raise ValueError(f"text_methods: {NO_CAPTIONER}")
            if m not in TEXT_METHODS:
                raise ValueError(f"text_methods: {m!r} is not one of {TEXT_METHODS}")
        for name in ("image_methods", "text_methods"):
            if len(set(getattr(self, name))) != len(getattr(self, name)):
                raise ValueError(f"{name} repeat: {list(getattr(self, name))}")

    @property
    def grid(self) -> list[tuple[str, str]]:
        """The grid's cells ``(image_method, text_method)``; none without the two lists."""
        if not self.image_methods and not self.text_methods:
            return []
        images = self.image_methods or (self.image_method,)
        texts = self.text_methods or (self.text_method,)
        return list(itertools.product(images, texts))

    @property
    def world(self) -> WorldConfig:
        val = max(self.images // 20, 1)
        classes = WorldConfig().classes
        if self.partner_contrast is not None:
            partners = {b for _, b in PAIRS}
            classes = tuple(
                replace(c, contrast=self.partner_contrast) if c.name in partners else c
                for c in classes
            )
        return WorldConfig(
            classes=classes,
            images=self.images,
            val=val,
            test=self.test,
            cooccurrence=self.cooccurrence,
            seed=self.seed,
            caption_style=self.caption_style,
        )

    def to_dict(self) -> dict[str, Any]:
        lists = {k: list(getattr(self, k)) for k in ("channels", "ratios")}
        lists |= {k: list(getattr(self, k)) for k in ("image_methods", "text_methods")}
        return {**asdict(self), **lists, "world": self.world.to_dict()}


def prepare_world(config: ExperimentConfig, out: Path) -> World:
    """The world in ``out/world``, reused when it was written with the same knobs."""
    root = out / "world"
    if (root / "world.json").exists():
        world = read_world(root)
        if world.config == config.world:
            return world
    return write_world(config.world, root)


def synth_config(world: World, config: ExperimentConfig, captions: str, policy: str) -> SynthConfig:
    """The synth options of a run on the world: ``config``'s image and text methods (OpenCV's
    inpainting for ``inpaint``), ``policy``, ``captions`` (``one`` or ``all``) and seed, the
    world's vocabulary; every other option synth's default."""
    from counterfactual.image import ImageConfig
    from counterfactual.method.selection import SelectionConfig
    from counterfactual.text import TextConfig

    image = {"method": config.image_method}
    if config.image_method == "inpaint":
        image["backend"] = "opencv"
    return SynthConfig(
        selection=SelectionConfig(policy=policy),
        image=ImageConfig.from_flat(image),
        text=TextConfig(method=config.text_method),
        vocabulary=str(world.vocabulary),
        captions=captions,
        seed=config.seed,
    )


def synth_spec(world: World, split: str) -> DataSpec:
    """The world's ``split`` as synth reads it: a COCO dataset with Karpathy's split file."""
    return DataSpec(
        kind="coco",
        root=str(world.root),
        coco_set=COCO_SET,
        split_file=str(world.split_file),
        split=split,
    )


def synth(
    world: World, split: str, out: Path, config: ExperimentConfig, captions: str, policy: str
) -> Path:
    """A local synth run (:func:`~counterfactual.synth.runner.run_local`) on one split of the
    world into ``out`` (resumes a finished run: nothing to do), and its contact sheet of
    :data:`CONTACT_SHEET` rows, as ``counterfactual synth --runner local`` makes them."""
    from counterfactual.progress import Progress
    from counterfactual.readers.spec import open_input
    from counterfactual.report import run_contact_sheet
    from counterfactual.synth.runner import run_local

    options = synth_config(world, config, captions, policy)
    inputs = open_input(synth_spec(world, split), options.images_per_shard)
    shards = inputs.shard_count(options.images_per_shard) or 0
    progress = Progress(inputs.image_count(), shards, unit=inputs.unit)
    run_local(inputs, str(out), options, progress=progress)
    records = inputs.records if isinstance(inputs.records, Sequence) else ()
    run_contact_sheet(str(out), records, CONTACT_SHEET)
    return out


def write_clean_queries(world: World, queries: Path, out: Path) -> int:
    """``queries``' shards again with each picture drawn anew without its removed classes
    (the same keys, captions and metadata): the clean renders. Returns the samples written."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for shard in sorted(queries.glob("*.tar")):
        members = _read_samples(shard)
        for key, parts in members.items():
            if "json" in parts and "jpg" in parts:
                meta = json.loads(parts["json"])
                removed = meta["plan"]["removed"]
                pixels = world.picture(int(meta["image_id"]), without=removed)
                members[key] = {**parts, "jpg": encode_jpeg(pixels, JPEG_QUALITY)}
                n += 1
        _write_samples(out / shard.name, members.items())
    return n


def _read_samples(shard: Path) -> dict[str, dict[str, bytes]]:
    """A tar's files grouped by sample key (the name before its first dot), in tar order."""
    members: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard) as tar:
        for info in tar:
            if info.isfile():
                key, _, ext = info.name.partition(".")
                data = tar.extractfile(info)
                members.setdefault(key, {})[ext] = data.read() if data else b""
    return members


def _write_samples(path: Path, samples: Iterable[tuple[str, dict[str, bytes]]]) -> None:
    """``(key, {ext: bytes})`` samples as the tar ``path``, written whole (a ``.part`` renamed)."""
    tmp = path.with_name(path.name + ".part")
    with tarfile.open(tmp, "w") as tar:
        for key, parts in samples:
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def subset_size(ratio: float, n_original: int) -> int:
    """|D'_sub| for a sweep ratio: ``ratio`` · |D|, rounded (at least 1 for a ratio > 0)."""
    return max(1, round(ratio * n_original)) if ratio > 0 else 0


def write_subsets(
    pool: Path, sizes: Mapping[float, int], seed: int, out: Path
) -> dict[float, Path]:
    """D'_sub for each ratio: the first ``sizes[ratio]`` samples of one permutation of the
    committed samples of ``pool`` (a synth run folder), seeded by ``seed`` (so a smaller subset
    lies inside a larger one and a rerun draws the same), as ``out/ratio-R/sub-NNNNNN.tar``
    shards of :data:`SWEEP_SHARD` whole samples (every file of a key). A folder already
    written (its ``done`` marker) is kept. ``ValueError`` when the pool holds too few samples."""
    from counterfactual.train.mix import expand_shards

    folders = {r: out / f"ratio-{r:g}" for r, n in sizes.items() if n > 0}
    todo = {r: f for r, f in folders.items() if not (f / "done").exists()}
    if not todo:
        return folders
    samples: list[tuple[str, dict[str, bytes]]] = []
    for shard in expand_shards([str(pool)]):
        samples += _read_samples(Path(shard)).items()
    need = max(sizes[r] for r in todo)
    if need > len(samples):
        worst = max(todo, key=lambda r: sizes[r])
        raise ValueError(
            f"ratio {worst:g} needs {need} samples of D' but {pool} holds {len(samples)}"
        )
    order = np.random.default_rng(keyed_int(seed, "sweep")).permutation(len(samples))
    for ratio, folder in todo.items():
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        chosen = [samples[i] for i in order[: sizes[ratio]].tolist()]
        for start in range(0, len(chosen), SWEEP_SHARD):
            name = f"sub-{start // SWEEP_SHARD:06d}.tar"
            _write_samples(folder / name, chosen[start : start + SWEEP_SHARD])
        (folder / "done").write_text(f"{len(chosen)}\n", "utf-8")
    return folders


def train_config(
    init: Path, original: Path, synthetic: Path | None, ratio: float, config: ExperimentConfig,
    seed: int,
) -> TrainConfig:  # fmt: skip
    """``train --recipe scratch``'s options for one arm: one epoch of ``steps`` batches from
    ``init``; with ``synthetic``, D' drawn at ``ratio`` per original sample (rounded to 6
    significant digits, as the arms trained so far recorded it; without, the recipe's)."""
    from counterfactual.train.config import TrainConfig

    mix: dict[str, Any] = {}
    if synthetic is not None:
        mix = {"synthetic": (str(synthetic),), "ratio": float(f"{ratio:.6g}")}
    return TrainConfig(
        recipe="scratch",
        model=str(init),
        original=(str(original),),
        mix="ratio",
        epochs=1,
        batch_size=config.batch_size,
        lr=config.lr,
        samples_per_epoch=config.steps * config.batch_size,
        seed=seed,
        device=config.device,
        log_every=100,
        num_workers=config.workers,
        **mix,
    )


def train_arm(
    init: Path, original: Path, synthetic: Path | None, ratio: float, out: Path,
    config: ExperimentConfig, seed: int,
) -> Path:  # fmt: skip
    """:func:`~counterfactual.train.trainer.fine_tune` of one arm (:func:`train_config`) into
    ``out``; a finished arm is resumed after its last epoch: nothing to do, its config
    checked. Returns the trained model's folder."""
    from counterfactual.train.trainer import fine_tune

    return fine_tune(train_config(init, original, synthetic, ratio, config, seed), out).final_dir


def eval_run(
    world: World, queries: Path, models: Sequence[Path], out: Path, cache: Path,
    config: ExperimentConfig, recall: bool,
) -> EvalRun:  # fmt: skip
    """``eval``'s options: ``models`` (scratch folders) on ``queries``, the world's every
    caption the gallery, R@K on its test split when ``recall``; no qualitative grid."""
    return EvalRun(
        queries=str(queries),
        models=tuple(f"scratch:{model}" for model in models),
        out=out,
        dataset="coco",
        root=world.root,
        split_file=world.split_file,
        recall=recall,
        cache=cache,
        vocabulary=str(world.vocabulary),
        device=config.device,
        batch_size=256,
        grid=0,
    )


def evaluate(
    world: World, queries: Path, models: Sequence[Path], out: Path, cache: Path,
    config: ExperimentConfig, recall: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`~counterfactual.eval.run.run_eval` of ``models`` on ``queries``
    (:func:`eval_run`); each model's ``report.json`` entry."""
    from counterfactual.eval.run import run_eval
    from counterfactual.train.mix import expand_shards

    evaluation = eval_run(world, queries, models, out, cache, config, recall)
    run_eval(evaluation, expand_shards(evaluation.queries))
    return json.loads((out / "report.json").read_text("utf-8"))["models"]


def arm_metrics(pipeline: dict[str, Any], clean: dict[str, Any]) -> dict[str, float]:
    """One arm's :data:`METRICS` from its two report entries (R@K: percent -> fraction;
    hubness: the pipeline's queries')."""
    metrics: dict[str, float] = {}
    for k in KS:
        metrics[f"odmap@{k}"] = float(pipeline["odmap"][str(k)])
    for k in KS:
        metrics[f"clean_odmap@{k}"] = float(clean["odmap"][str(k)])
    recall = pipeline["recall"]
    for name, key in (("i2t", "image_to_text"), ("t2i", "text_to_image")):
        for k in KS:
            metrics[f"{name}_r@{k}"] = float(recall[key][str(k)]) / 100.0
    hub = pipeline["hubness"]
    for k in KS:
        metrics[f"hub_skew@{k}"] = float(hub["skewness"][str(k)])
    metrics["hub_top1"] = float(hub["top1_share"])
    return metrics


def class_roles(world: WorldConfig) -> dict[str, str]:
    """Each class's role (:data:`ROLES`) in ``world``."""
    roles = {c.name: "unpaired" for c in world.classes}
    for anchor, partner in world.pairs:
        roles[anchor], roles[partner] = "anchor", "partner"
    return roles


def role_metrics(
    pipeline: dict[str, Any], clean: dict[str, Any], roles: dict[str, str]
) -> dict[str, dict[str, float]]:
    """One arm's ODmAP@k (pipeline and clean queries) over the queries of each removed-class
    role, from the report entries' ``odmap_by_removed``, with the number of queries: which part
    of a gain is the shortcut unlearned (``partner``) and which a better model overall."""
    out: dict[str, dict[str, float]] = {}
    for role in ROLES:
        row: dict[str, float] = {}
        for prefix, entry in (("odmap", pipeline), ("clean_odmap", clean)):
            cells = [
                cell
                for key, cell in entry["odmap_by_removed"].items()
                if ("several" if "+" in key else roles.get(key, "unpaired")) == role
            ]
            n = sum(cell["queries"] for cell in cells)
            row["queries"] = float(n)
            for k in KS:
                total = sum(cell["queries"] * cell["odmap"][str(k)] for cell in cells)
                row[f"{prefix}@{k}"] = total / n if n else float("nan")
        if row["queries"]:
            out[role] = row
    return out


def summarise_roles(runs: Sequence[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """``{role: {"queries", "mean", "std"}}`` over seeds (the roles every seed has)."""
    summary: dict[str, Any] = {}
    for role in ROLES:
        rows = [run[role] for run in runs if role in run]
        if len(rows) != len(runs) or not rows:
            continue
        table = np.array([[r[m] for m in ROLE_METRICS] for r in rows], np.float64)
        summary[role] = {
            "queries": int(rows[0]["queries"]),
            "mean": dict(zip(ROLE_METRICS, map(float, table.mean(axis=0)), strict=True)),
            "std": dict(zip(ROLE_METRICS, map(float, table.std(axis=0)), strict=True)),
        }
    return summary


def summarise(runs: Sequence[dict[str, float]]) -> dict[str, Any]:
    """``{"mean", "std", "seeds"}`` over seeds (std: population, 0 for one seed)."""
    table = np.array([[r[m] for m in METRICS] for r in runs], np.float64)
    return {
        "mean": dict(zip(METRICS, map(float, table.mean(axis=0)), strict=True)),
        "std": dict(zip(METRICS, map(float, table.std(axis=0)), strict=True)),
        "seeds": [dict(r) for r in runs],
    }


@dataclass(frozen=True)
class LoopData:
    """What every seed trains on and is scored on: the world, D (``originals``), D'
    (``d_prime``), the pipeline's queries and their clean renders, and the sample counts."""

    world: World
    originals: Path
    d_prime: Path
    queries: Path
    clean: Path
    n_original: int
    n_synthetic: int

    @property
    def natural_ratio(self) -> float:
        """D' samples per D sample, as synth made them."""
        return self.n_synthetic / self.n_original


def make_data(config: ExperimentConfig, out: Path, seconds: dict[str, float]) -> LoopData:
    """Steps 1-3 of the loop (module docstring), each reused when already done; their times
    go to ``seconds`` (``world``, ``synth``)."""
    from counterfactual.train.mix import count_samples, expand_shards

    start = time.perf_counter()
    world = prepare_world(config, out)
    originals = out / "shards" / "original"
    if not originals.exists():
        write_original_shards(world, "train", originals, seed=config.seed)
    seconds["world"] = time.perf_counter() - start
    start = time.perf_counter()
    train = out / "synth-train"
    d_prime = synth(world, "train", train, config, config.captions_per_image, config.policy)
    queries = synth(world, "test", out / "synth-test", config, "one", "uniform")
    seconds["synth"] = time.perf_counter() - start
    clean = out / "queries-clean"
    write_clean_queries(world, queries, clean)
    return LoopData(
        world,
        originals,
        d_prime,
        queries,
        clean,
        sum(count_samples(s) for s in expand_shards([str(originals)])),
        sum(count_samples(s) for s in expand_shards([str(d_prime)])),
    )


def run_seed(
    config: ExperimentConfig, data: LoopData, ratio: float, vocab: Any,
    seed: int, folder: Path, seconds: dict[str, float],
    extra: Mapping[str, tuple[Path, float]] | None = None,
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:  # fmt: skip
    """Steps 4-5 for one seed: arms D, D+D' and each of ``extra`` (name: D' shards, ratio) from
    the same initial weights, scored on both query sets by one ``eval`` each; every arm's
    report entries ``(pipeline, clean)`` by name, :data:`ARMS` first."""
    from counterfactual.models.scratch import ScratchConfig, init_model

    init = init_model(folder / "init", vocab, ScratchConfig(channels=config.channels, seed=seed))
    start = time.perf_counter()
    arms = {"D": (None, ratio), "D+D'": (data.d_prime, ratio), **(extra or {})}
    models = {
        name: train_arm(init, data.originals, synthetic, r, folder / name, config, seed)
        for name, (synthetic, r) in arms.items()
    }
    seconds["train"] = seconds.get("train", 0.0) + time.perf_counter() - start
    start = time.perf_counter()
    cache = folder.parent / "cache"
    world, paths = data.world, list(models.values())
    pipeline = evaluate(world, data.queries, paths, folder / "eval", cache, config, True)
    clean = evaluate(world, data.clean, paths, folder / "eval-clean", cache, config, False)
    seconds["eval"] = seconds.get("eval", 0.0) + time.perf_counter() - start
    return dict(zip(models, zip(pipeline, clean, strict=True), strict=True))


@dataclass(frozen=True)
class Studies:
    """The extra arms of the sweep and the grid: ``arms`` (name: D' shards, ratio), and which
    arm each sweep ratio (``sweep``: ratio, D'_sub samples, arm) and grid cell (``grid``:
    image method, text method, D' samples, arm) reads."""

    arms: dict[str, tuple[Path, float]]
    sweep: list[tuple[float, int, str]]
    grid: list[tuple[str, str, int, str]]


def plan_studies(
    config: ExperimentConfig, data: LoopData, out: Path,
    seconds: dict[str, float], log: Callable[[str], None],
) -> Studies:  # fmt: skip
    """The sweep's D'_sub and the grid's D' (synth runs and subsets, reused when done) and the
    arms they add; their time goes to ``seconds["studies"]``."""
    from counterfactual.train.mix import count_samples, expand_shards

    start = time.perf_counter()
    arms: dict[str, tuple[Path, float]] = {}
    sweep: list[tuple[float, int, str]] = []
    if config.ratios:
        pool = data.d_prime
        if config.captions_per_image != "all":
            pool = synth(data.world, "train", out / "synth-train-all", config, "all", config.policy)
        sizes = {r: subset_size(r, data.n_original) for r in config.ratios}
        subsets = write_subsets(pool, sizes, config.seed, out / "sweep")
        for r in sorted(config.ratios):
            name = "D" if r == 0 else f"sweep-{r:g}"
            if r:
                arms[name] = (subsets[r], r)
            sweep.append((r, sizes[r], name))
        log(f"sweep: D'_sub of {', '.join(str(sizes[r]) for r in sorted(sizes))} samples")
    grid: list[tuple[str, str, int, str]] = []
    for image, text in config.grid:
        if (image, text) == (config.image_method, config.text_method):
            grid.append((image, text, data.n_synthetic, "D+D'"))
            continue
        cell = replace(config, image_method=image, text_method=text)
        d_prime = synth(
            data.world, "train", out / "grid" / f"synth-{image}-{text}", cell,
            config.captions_per_image, config.policy,
        )  # fmt: skip
        n = sum(count_samples(s) for s in expand_shards([str(d_prime)]))
        name = f"grid-{image}-{text}"
        arms[name] = (d_prime, config.ratio or n / data.n_original)
        grid.append((image, text, n, name))
    seconds["studies"] = time.perf_counter() - start
    return Studies(arms, sweep, grid)


def run_experiment(
    config: ExperimentConfig, out: str | Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The loop (module docstring), each step the library function its command calls; returns
    what ``OUT/results.json`` holds."""
    import torch

    from counterfactual.models.scratch import build_vocab
    from counterfactual.world.results import plot, sweep_plot, table

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(config.threads)  # fixed: CPU sums depend on the thread count
    seconds: dict[str, float] = {}
    data = make_data(config, out, seconds)
    ratio = config.ratio or data.natural_ratio
    log(
        f"D: {data.n_original} pairs, D': {data.n_synthetic} ({data.natural_ratio:.3f} per "
        f"original); drawn at {ratio:.3g}"
    )
    studies = plan_studies(config, data, out, seconds, log)
    vocab = build_vocab(data.world.captions("train"))
    roles = class_roles(config.world)
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in (*ARMS, *studies.arms)}
    by_role: dict[str, list[dict[str, dict[str, float]]]] = {arm: [] for arm in ARMS}
    seconds["train"] = seconds["eval"] = 0.0
    for seed in range(config.seed, config.seed + config.seeds):
        folder = out / f"seed-{seed}"
        entries = run_seed(config, data, ratio, vocab, seed, folder, seconds, studies.arms)
        for arm, (pipeline, clean) in entries.items():
            runs[arm].append(arm_metrics(pipeline, clean))
            if arm in by_role:
                by_role[arm].append(role_metrics(pipeline, clean, roles))
            shown = ", ".join(f"{m} {v:.3f}" for m, v in runs[arm][-1].items())
            log(f"seed {seed} {arm}: {shown}")
    results = {
        "config": {
            **config.to_dict(),
            "ratio": ratio,
            "natural_ratio": data.natural_ratio,
            "original": data.n_original,
            "synthetic": data.n_synthetic,
        },
        "arms": {arm: summarise(runs[arm]) for arm in ARMS},
        "by_role": {arm: summarise_roles(by_role[arm]) for arm in ARMS},
    }
    if studies.sweep:
        results["sweep"] = [
            {"ratio": r, "samples": n, "arm": summarise(runs[arm])} for r, n, arm in studies.sweep
        ]
    if studies.grid:
        results["grid"] = [
            {"image_method": i, "text_method": t, "synthetic": n, "arm": summarise(runs[arm])}
            for i, t, n, arm in studies.grid
        ]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", "utf-8")
    (out / "timings.json").write_text(json.dumps(seconds, indent=1) + "\n", "utf-8")
    plot(results, out / "results.png")
    if studies.sweep:
        sweep_plot(results, out / "sweep.png")
    (out / "results.md").write_text(table(results, seconds), "utf-8")
    return results


__all__ = [
    "ARMS",
    "IMAGE_METHODS",
    "METRICS",
    "ROLES",
    "TEXT_METHODS",
    "ExperimentConfig",
    "HUBNESS",
    "LoopData",
    "Studies",
    "CONTACT_SHEET",
    "arm_metrics",
    "class_roles",
    "eval_run",
    "role_metrics",
    "make_data",
    "plan_studies",
    "subset_size",
    "write_subsets",
    "run_experiment",
    "run_seed",
    "summarise",
    "summarise_roles",
    "synth_config",
    "synth_spec",
    "train_arm",
    "train_config",
    "write_clean_queries",
]
