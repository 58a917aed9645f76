"""Where a run's work goes on a cluster: actors per model stage, GPUs per actor, shard workers.

A pure function of the cluster's resources (:class:`Cluster`: its nodes' CPUs and GPUs) and
what the stages declare (:class:`~counterfactual.synth.steps.Resources`), checked against the
cluster before anything starts; ``pipelines/synth.py`` places what it says on Ray. The rules:

- A model stage on CUDA runs on an actor pool of its own (on CPU too with ``model_actors``);
  other stages run in the shard workers. Every model actor holds one CPU.
- The heavy stage (the inpainter, ``Resources.heavy``) gets one actor per GPU, each of
  the GPU less the light stages' shares, so every GPU keeps room for one actor of each
  light stage.
- A light stage (detector, captioner, verifier) is sized by its cost per item against the
  heavy stage's (``Resources.cost``, :mod:`counterfactual.synth.costs`; ``--stage-cost``
  overrides): its GPU share must give it ``VERIFY_HEADROOM`` times the heavy stage's rate,
  ``need = HEADROOM x (its seconds / the heavy's) x heavy share`` of each GPU. When one
  ``LIGHT_GPU`` actor per ``GPUS_PER_LIGHT_ACTOR`` GPUs (at least one) covers the need, it
  gets that; when more ``LIGHT_GPU`` actors, up to one per GPU, cover it, it gets those; else
  one actor per GPU of exactly its need, and the heavy share shrinks to what is left
  (``heavy = (1 - LIGHT_GPU x others) / (1 + sum of HEADROOM x cost ratios)``). A stage
  without a declared cost gets the minimum. Without a heavy stage on the GPUs, the GPU
  stages are all shared out as heavy.
- ``gpus_per_actor`` sets the heavy stage's share (as many actors as fit); ``model_actors``
  sets the actors of every pooled stage. A share above one GPU is a whole number of GPUs.
- The shard workers (one CPU each) take the CPUs left, at least one (``cpu_actors`` sets them),
  but with model stages on GPUs no more than those can consume: ``workers <= WORKERS_PER_ITEM x
  (GPU actors of the heavy stage) x (its model batch)``. A worker's CPU work per item (decode,
  crop, encode: tens of ms) is some ten times a GPU's per item in a batch (LaMa: 2-4 ms), so
  two workers per item of each actor's batch keep a batch on the GPU and the next one queued,
  and the other CPUs stay free (a 192-CPU node with 8 GPUs at batch 8 runs 128 workers, not
  182). On CPU the workers are the compute and take every CPU left.

Ray puts a fractional GPU request on one GPU of one node, so the check packs the actors onto
the nodes' GPUs (first fit, largest first), and a layout that does not fit is a
:class:`~counterfactual.synth.staging.SetupError` of one line naming the stage, what it asks for
and what the cluster has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from counterfactual.synth.staging import SetupError, Stage
from counterfactual.synth.steps import VERIFY_HEADROOM

LIGHT_GPU = 0.1
"""A light stage's actor: a tenth of a GPU beside the heavy stage's."""
GPUS_PER_LIGHT_ACTOR = 4
"""One actor of each light stage per this many GPUs."""
MODEL_CPUS = 1.0
"""CPUs each model actor holds (it feeds its GPU)."""
HEADROOM = VERIFY_HEADROOM
"""A light stage's capacity over the heavy stage's rate (``steps.VERIFY_HEADROOM``)."""
WORKERS_PER_ITEM = 2
"""Shard workers per item of a GPU actor's batch (the module doc's rule)."""
_EPS = 1e-4  # Ray's resolution of fractional resources


@dataclass(frozen=True, slots=True)
class Node:
    """One node's CPUs and GPUs (as Ray counts them; a GPU count may be fractional)."""

    cpus: float
    gpus: float = 0.0

    def gpu_slots(self) -> list[float]:
        """The node's GPUs as capacities: whole ones, then the fraction left, if any."""
        whole = int(self.gpus + _EPS)
        rest = self.gpus - whole
        return [1.0] * whole + ([rest] if rest > _EPS else [])


@dataclass(frozen=True, slots=True)
class Cluster:
    """The resources a run may use: its alive nodes."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        for node in self.nodes:
            if node.cpus < 0 or node.gpus < 0:
                raise ValueError(f"a node's CPUs and GPUs must be >= 0, got {node}")

    @classmethod
    def single(cls, cpus: float, gpus: float = 0.0) -> Cluster:
        return cls((Node(cpus, gpus),))

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    def describe(self) -> str:
        """``2 GPUs and 16 CPUs on 1 node`` (what error lines say the cluster has)."""
        nodes = len(self.nodes)
        gpus = f"{self.gpus:g} GPU{'s' * (self.gpus != 1)}" if self.gpus else "no GPU"
        return f"{gpus} and {self.cpus:g} CPUs on {nodes} node{'s' * (nodes != 1)}"


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage's place: ``stage`` (its model stage's name, ``None`` for a CPU stage),
    ``actors`` (0: the shard workers run it), ``gpus_per_actor``, ``rule`` (how they were
    decided, in words) and ``seconds_per_item`` (the cost the rule used; 0: none declared)."""

    stage: str | None
    actors: int = 0
    gpus_per_actor: float = 0.0
    rule: str = ""
    seconds_per_item: float = 0.0


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the work goes: per stage its actors and GPUs per actor, and the shard workers."""

    model_actors: tuple[int, ...]
    """Per stage: its actors (0: the workers run it)."""
    gpus: tuple[float, ...]
    """Per stage: GPUs per actor."""
    workers: int
    stages: tuple[str | None, ...] = ()
    """Per stage: the model stage's name (``None``: a CPU stage)."""
    cluster: Cluster = Cluster(())
    rule: str = ""
    """How ``workers`` was decided, in words (``synth --dry-run`` shows it)."""
    stage_rules: tuple[str, ...] = ()
    """Per stage: how its actors and share were decided, in words (``""``: a CPU stage)."""
    costs: tuple[float, ...] = ()
    """Per stage: the seconds per item the rule used (0: none declared, or a CPU stage)."""

    def for_shards(self, shards: int | None) -> Layout:
        """This layout with no more shard workers than the ``shards`` a run has left to make
        (``None``: not known, unchanged): a worker makes one shard at a time, so more would only
        start and load their steps to wait. The rule says so."""
        if shards is None or not 0 < shards < self.workers:
            return self
        cap = f"at most the {shards} shard{'s' if shards > 1 else ''} left to make"
        return replace(self, workers=shards, rule=f"{self.rule}; {cap}" if self.rule else cap)

    def plans(self) -> list[StagePlan]:
        n = len(self.stages)
        rules, costs = self.stage_rules or ("",) * n, self.costs or (0.0,) * n
        return [
            StagePlan(*row)
            for row in zip(self.stages, self.model_actors, self.gpus, rules, costs, strict=True)
        ]

    def to_json(self) -> dict[str, Any]:
        """What ``synth --dry-run`` prints: the cluster's GPUs and CPUs, the shard workers and
        every model stage (``actors`` 0: run inside the workers; ``rule``: why;
        ``seconds_per_item``: the cost it was sized by, ``null`` when none was declared)."""
        return {
            "gpus": _num(self.cluster.gpus),
            "cpus": _num(self.cluster.cpus),
            "workers": self.workers,
            "workers_rule": self.rule,
            "stages": [
                {
                    "stage": p.stage,
                    "actors": p.actors,
                    "gpus_per_actor": _num(p.gpus_per_actor),
                    "rule": p.rule,
                    "seconds_per_item": float(f"{p.seconds_per_item:.4g}") or None,
                }
                for p in self.plans()
                if p.stage is not None
            ],
        }


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 4)


def on_gpu(stage: Stage) -> bool:
    """Whether the stage's model step declares a CUDA device."""
    return stage.resources is not None and stage.resources.device.startswith("cuda")


def plan_layout(
    stages: Sequence[Stage],
    cluster: Cluster,
    *,
    model_actors: int | None = None,
    gpus_per_actor: float | None = None,
    cpu_actors: int | None = None,
    model_batch_size: int | None = None,
    stage_costs: Mapping[str, float] | None = None,
) -> Layout:
    """The layout of ``stages`` on ``cluster`` by the rules of the module doc, or
    :class:`SetupError` (one line) when it does not fit. ``model_batch_size``: items per model
    call when it overrides the stages' own (``--model-batch-size``); ``stage_costs``: seconds
    per item by stage name, over the stages' declared ``Resources.cost`` (``--stage-cost``)."""
    if gpus_per_actor is not None and (
        not 0 < gpus_per_actor <= 8
        or (gpus_per_actor > 1 and not float(gpus_per_actor).is_integer())
    ):
        raise ValueError(
            f"gpus_per_actor must be a fraction in (0, 1] or a whole number up to 8, "
            f"got {gpus_per_actor}"
        )
    pooled = [s.resources is not None and (on_gpu(s) or model_actors is not None) for s in stages]
    gpu = [p and on_gpu(s) for s, p in zip(stages, pooled, strict=True)]
    heavy = [
        g and s.resources is not None and s.resources.heavy
        for s, g in zip(stages, gpu, strict=True)
    ]
    if not any(heavy):  # no inpainter on the GPUs: the GPU stages share them as equals
        heavy = list(gpu)
    light = [g and not h for g, h in zip(gpu, heavy, strict=True)]
    n_heavy = sum(heavy)
    slots = [slot for node in cluster.nodes for slot in node.gpu_slots()]
    # the shares are of one GPU; of the largest fraction when the cluster has no whole one
    unit = max(slots) if slots and all(s < 1 - _EPS for s in slots) else 1.0
    whole_gpus = sum(1 for s in slots if s >= 1 - _EPS) or len(slots)
    costs = [_cost(s, stage_costs) for s in stages]
    heavy_cost = max((c for c, h in zip(costs, heavy, strict=True) if h), default=0.0)
    if model_actors is not None:  # every pool as asked: light stages at LIGHT_GPU
        sizes = {i: _Light(1, LIGHT_GPU, f"--model-actors {model_actors}") for i in _at(light)}
        per_gpu = LIGHT_GPU * len(sizes)
    else:
        sizes, per_gpu = _size_light(_at(light), costs, heavy_cost, whole_gpus)
    if gpus_per_actor is not None:
        heavy_share = gpus_per_actor
        heavy_rule = f"--gpus-per-actor {gpus_per_actor:g}: as many actors as fit"
    else:
        heavy_share = math.floor((1 - per_gpu) * unit / max(1, n_heavy) * 1e4 + _EPS) / 1e4
        heavy_rule = "one actor per GPU" if n_heavy else ""
        if per_gpu:
            heavy_rule += f", the GPU less the light stages' {_num(per_gpu)}"
    rules = [""] * len(stages)

    actors = [0] * len(stages)
    shares = [0.0] * len(stages)
    for i, stage in enumerate(stages):
        if not pooled[i]:
            continue
        if not gpu[i]:
            actors[i] = model_actors or 1
            rules[i] = f"--model-actors {actors[i]} on {stage.resources.device}"  # type: ignore[union-attr]
            continue
        shares[i] = heavy_share if heavy[i] else round(sizes[i].share * unit, 4)
        rules[i] = heavy_rule if heavy[i] else sizes[i].rule
        if not cluster.gpus:
            raise SetupError(_ask(stage, model_actors or 1, shares[i], cluster))
        if model_actors is not None:
            actors[i] = model_actors
            rules[i] = f"--model-actors {model_actors}"
        elif light[i]:
            actors[i] = sizes[i].actors
    if model_actors is None and n_heavy:
        actors = _most_heavy(stages, cluster, actors, shares, heavy)
    held = sum(actors) * MODEL_CPUS
    if cpu_actors is None and cluster.cpus - held < 1:
        raise SetupError(
            f"the cluster's {cluster.cpus:g} CPUs leave none for a shard worker after "
            f"{sum(actors)} model actors (one CPU each); lower --model-actors or join a larger "
            "cluster"
        )
    _pack(stages, cluster, actors, shares)
    free = max(1, int(cluster.cpus - held + _EPS))
    workers, rule = _workers(stages, actors, heavy, free, cpu_actors, model_batch_size)
    if cpu_actors is not None and cpu_actors + held > cluster.cpus + _EPS:
        raise SetupError(
            f"--cpu-actors {cpu_actors} and {sum(actors)} model actors (one CPU each) ask for "
            f"{cpu_actors + held:g} CPUs but the cluster has {cluster.describe()}; lower "
            "--cpu-actors or --model-actors"
        )
    names = tuple(s.resources.stage if s.resources is not None else None for s in stages)
    used = tuple(c if p else 0.0 for c, p in zip(costs, pooled, strict=True))
    return Layout(tuple(actors), tuple(shares), workers, names, cluster, rule, tuple(rules), used)


@dataclass(frozen=True, slots=True)
class _Light:
    """A light stage's size: ``actors`` of ``share`` of a GPU each, and why (``rule``)."""

    actors: int
    share: float
    rule: str


def _at(flags: Sequence[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]


def _cost(stage: Stage, overrides: Mapping[str, float] | None) -> float:
    """The stage's seconds per item: the override for its name, else its declared cost."""
    res = stage.resources
    if res is None:
        return 0.0
    return (overrides or {}).get(res.stage, res.cost)


def _ceil4(x: float) -> float:
    return math.ceil(x * 1e4 - _EPS) / 1e4


def _size_light(
    light: Sequence[int], costs: Sequence[float], heavy_cost: float, gpus: int
) -> tuple[dict[int, _Light], float]:
    """Each light stage's actors and share (of one GPU) by the module doc's rule, and the share
    of every GPU the light stages leave the heavy one out of (``1 -`` the heavy share)."""
    minimum = max(1, math.ceil(gpus / GPUS_PER_LIGHT_ACTOR))
    ratio = {i: HEADROOM * costs[i] / heavy_cost for i in light if costs[i] and heavy_cost}
    spread: set[int] = set()  # one actor per GPU of exactly its need
    while True:
        heavy = (1 - LIGHT_GPU * (len(light) - len(spread))) / (1 + sum(ratio[i] for i in spread))
        more = {i for i in ratio if i not in spread and ratio[i] * heavy > LIGHT_GPU + _EPS}
        if not more:
            break
        spread |= more
    out: dict[int, _Light] = {}
    for i in light:
        if i not in ratio:
            why = "no cost declared" if heavy_cost else "the heavy stage declares no cost"
            out[i] = _Light(minimum, LIGHT_GPU, f"{_min_rule(minimum)} ({why})")
            continue
        need = ratio[i] * heavy
        capacity = (
            f"capacity >= {HEADROOM:g} x the heavy stage's rate: {HEADROOM:g} x "
            f"{costs[i]:.3g} s / {heavy_cost:.3g} s x heavy share {_num(round(heavy, 4))} = "
            f"{_num(_ceil4(need))} GPU per GPU"
        )
        if i in spread:
            out[i] = _Light(gpus, _ceil4(need), f"{capacity}: one actor per GPU of that share")
            continue
        n = max(minimum, math.ceil(gpus * need / LIGHT_GPU - _EPS))
        what = _min_rule(minimum) if n == minimum else f"{n} actors of {LIGHT_GPU:g} GPU"
        out[i] = _Light(n, LIGHT_GPU, f"{capacity}: {what}")
    per_gpu = sum(s.share for s in out.values())
    return out, per_gpu


def _min_rule(n: int) -> str:
    return (
        f"one {LIGHT_GPU:g} GPU actor per {GPUS_PER_LIGHT_ACTOR} GPUs ({n} actor{'s' * (n != 1)})"
    )


def _workers(
    stages: Sequence[Stage],
    actors: Sequence[int],
    heavy: Sequence[bool],
    free: int,
    cpu_actors: int | None,
    model_batch_size: int | None,
) -> tuple[int, str]:
    """The shard workers and the rule that gave them (the module doc's): ``cpu_actors`` when
    given, else the CPUs left, capped by what the heavy GPU stage consumes."""
    if cpu_actors is not None:
        return cpu_actors, f"--cpu-actors {cpu_actors}"
    fed = [
        (n, model_batch_size or stage.resources.batch_size)
        for stage, n, h in zip(stages, actors, heavy, strict=True)
        if h and n and stage.resources is not None
    ]
    if not fed:
        return free, f"the CPUs left after the model actors ({free}); no GPU stage to feed"
    n, batch = max(fed, key=lambda f: f[0] * f[1])
    cap = WORKERS_PER_ITEM * n * batch
    rule = (
        f"min(CPUs left {free}, {WORKERS_PER_ITEM} x {n} GPU actor{'s' * (n != 1)} x "
        f"batch {batch} = {cap})"
    )
    return min(free, cap), rule


def _most_heavy(
    stages: Sequence[Stage],
    cluster: Cluster,
    actors: list[int],
    shares: list[float],
    heavy: list[bool],
) -> list[int]:
    """The most actors per heavy stage (the same for each) that fit beside the light ones;
    at least one each (``_pack`` then names what does not fit)."""
    share = max(shares[i] for i, h in enumerate(heavy) if h)
    n_heavy = sum(heavy)
    top = max(1, int(cluster.gpus / (share * n_heavy) + _EPS))
    for n in range(top, 0, -1):
        trial = [n if h else a for a, h in zip(actors, heavy, strict=True)]
        if _fits(cluster, trial, shares):
            return trial
    return [1 if h else a for a, h in zip(actors, heavy, strict=True)]


def _demands(actors: Sequence[int], shares: Sequence[float]) -> list[tuple[float, int]]:
    """Every model actor as (GPUs, stage index), largest first (first fit decreasing)."""
    out = [(shares[i], i) for i, n in enumerate(actors) for _ in range(n)]
    return sorted(out, key=lambda d: -d[0])


def _place(
    cluster: Cluster, actors: Sequence[int], shares: Sequence[float]
) -> tuple[int, int] | None:
    """Place every model actor on a node with a CPU and its GPU share (a fraction on one GPU,
    a whole number on that many free GPUs); the first that does not fit as (stage index,
    actors of its stage placed), else ``None``."""
    cpus = [n.cpus for n in cluster.nodes]
    gpus = [n.gpu_slots() for n in cluster.nodes]
    placed = [0] * len(actors)
    for share, i in _demands(actors, shares):
        for k in range(len(cpus)):
            if cpus[k] < MODEL_CPUS - _EPS:
                continue
            if share > 1:
                free = [j for j, g in enumerate(gpus[k]) if g >= 1 - _EPS]
                if len(free) < share:
                    continue
                for j in free[: int(share)]:
                    gpus[k][j] = 0.0
            elif share > 0:
                slot = next((j for j, g in enumerate(gpus[k]) if g >= share - _EPS), None)
                if slot is None:
                    continue
                gpus[k][slot] -= share
            cpus[k] -= MODEL_CPUS
            break
        else:
            return i, placed[i]
        placed[i] += 1
    return None


def _fits(cluster: Cluster, actors: Sequence[int], shares: Sequence[float]) -> bool:
    return _place(cluster, actors, shares) is None


def _pack(
    stages: Sequence[Stage], cluster: Cluster, actors: Sequence[int], shares: Sequence[float]
) -> None:
    """:class:`SetupError` naming the first stage whose actors do not fit."""
    failed = _place(cluster, actors, shares)
    if failed is None:
        return
    i, placed = failed
    others = [
        f"{stages[j].resources.stage} {actors[j]} x {shares[j]:g}"  # type: ignore[union-attr]
        for j in range(len(stages))
        if j != i and actors[j]
    ]
    beside = f" beside {', '.join(others)}" if others else ""
    raise SetupError(_ask(stages[i], actors[i], shares[i], cluster, f"; {placed} fit{beside}"))


def _ask(stage: Stage, n: int, share: float, cluster: Cluster, more: str = "") -> str:
    """The one line of a stage the cluster cannot place."""
    res = stage.resources
    assert res is not None
    what = f"{n} actor{'s' * (n != 1)} x {share:g} GPU and {MODEL_CPUS:g} CPU"
    if not cluster.gpus and share:
        fix = "run it with --device cpu, or join a cluster with GPUs (RAY_ADDRESS)"
    else:
        fix = "lower --model-actors or --gpus-per-actor, or join a larger cluster"
    return (
        f"stage {res.stage} ({stage.steps[0]} on {res.device}) asks for {what} but the "
        f"cluster has {cluster.describe()}{more}; {fix}"
    )
