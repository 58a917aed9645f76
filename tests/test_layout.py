"""The cluster layout (:func:`counterfactual.synth.layout.plan_layout`), a pure function: actors
per model stage and GPUs per actor over many cluster shapes, and the one line of a layout the
cluster cannot hold. No Ray here (``tests/test_ray_layout.py`` places layouts on a real Ray)."""

from __future__ import annotations

import pytest

from counterfactual.image import ImageConfig
from counterfactual.method.detect import DetectConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.synth.layout import Cluster, Node, plan_layout
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.staging import SetupError, plan_stages
from counterfactual.text import TextConfig

DIFFUSERS = ImageConfig(method="inpaint", backend="diffusers")
VERIFY = VerifyConfig(mode="record")
CAPTION = TextConfig(method="captioner")


def stages(*parts: str, device: str = "cuda", batch: int = 16):
    """The stages of a run with the named model parts: inpaint, verify, caption, detect; the
    inpainter's batch of 16 feeds every worker these shapes leave (the cap on workers is
    ``tests/test_workers_sized.py``'s)."""
    config = SynthConfig(
        image=DIFFUSERS if "inpaint" in parts else ImageConfig(method="blur"),
        verify=VERIFY if "verify" in parts else VerifyConfig(),
        text=CAPTION if "caption" in parts else TextConfig(),
        detect=DetectConfig() if "detect" in parts else None,
    )
    return plan_stages(config, Runtime(device=device, inpaint_batch_size=batch))


def table(layout) -> dict[str, tuple[int, float]]:
    return {s["stage"]: (s["actors"], s["gpus_per_actor"]) for s in layout.to_json()["stages"]}


def one_node(gpus: float, cpus: float = 32) -> Cluster:
    return Cluster.single(cpus, gpus)


CASES = [
    # parts, cluster, expected {stage: (actors, GPUs per actor)}, shard workers
    (("inpaint",), one_node(1), {"Inpaint": (1, 1)}, 31),
    (("inpaint",), one_node(8), {"Inpaint": (8, 1)}, 24),
    (("inpaint", "verify"), one_node(1), {"Inpaint": (1, 0.9), "Verify": (1, 0.1)}, 30),
    (("inpaint", "verify"), one_node(2), {"Inpaint": (2, 0.9), "Verify": (1, 0.1)}, 29),
    (("inpaint", "verify"), one_node(8), {"Inpaint": (8, 0.9), "Verify": (2, 0.1)}, 22),
    (
        ("inpaint", "verify", "caption"),
        one_node(1),
        {"Inpaint": (1, 0.8), "Caption": (1, 0.1), "Verify": (1, 0.1)},
        29,
    ),
    (
        ("inpaint", "verify", "caption"),
        one_node(2),
        {"Inpaint": (2, 0.8), "Caption": (1, 0.1), "Verify": (1, 0.1)},
        28,
    ),
    (
        ("inpaint", "verify", "caption"),
        one_node(8),
        {"Inpaint": (8, 0.8), "Caption": (2, 0.1), "Verify": (2, 0.1)},
        20,
    ),
    (
        ("detect", "inpaint", "verify"),
        one_node(4),
        # OWLv2 at 0.04 of SD 2's cost: two 0.1 actors give it twice the inpainter's rate
        {"Detect": (2, 0.1), "Inpaint": (4, 0.8), "Verify": (1, 0.1)},
        25,
    ),
    # no heavy stage on the GPUs: the GPU stages share every GPU as equals
    (("verify",), one_node(2), {"Verify": (2, 1)}, 30),
    (("caption", "verify"), one_node(2), {"Caption": (2, 0.5), "Verify": (2, 0.5)}, 28),
    # fractional: a cluster with half a GPU scales every share
    (("inpaint", "verify"), one_node(0.5), {"Inpaint": (1, 0.45), "Verify": (1, 0.05)}, 30),
    # a GPU and a half: the whole one counts, the half is room for the light ones
    (("inpaint", "verify"), one_node(1.5), {"Inpaint": (1, 0.9), "Verify": (1, 0.1)}, 30),
    # several nodes: a CPU-only head, two GPU nodes; one actor per GPU, wherever it is
    (
        ("inpaint", "verify", "caption"),
        Cluster((Node(4), Node(8, 4), Node(8, 4))),
        {"Inpaint": (8, 0.8), "Caption": (2, 0.1), "Verify": (2, 0.1)},
        8,
    ),
    (
        ("inpaint", "verify"),
        Cluster((Node(16, 1), Node(16, 1), Node(16, 1))),
        {"Inpaint": (3, 0.9), "Verify": (1, 0.1)},
        44,
    ),
    # CPU-only runs: the models stay in the shard workers
    (("inpaint", "verify"), one_node(0, 4), {"Inpaint": (0, 0), "Verify": (0, 0)}, 4),
]


@pytest.mark.parametrize(("parts", "cluster", "expected", "workers"), CASES)
def test_layout_over_cluster_shapes(parts, cluster, expected, workers):
    device = "cuda" if cluster.gpus else "cpu"
    layout = plan_layout(stages(*parts, device=device), cluster)
    assert table(layout) == expected
    assert layout.workers == workers
    out = layout.to_json()
    assert (out["gpus"], out["cpus"], out["workers"]) == (cluster.gpus, cluster.cpus, workers)
    # never more GPUs than the cluster has, and the heavy stage holds nearly all of them
    asked = sum(n * g for n, g in expected.values())
    assert asked <= cluster.gpus + 1e-9
    if "Inpaint" in expected and cluster.gpus >= 1:
        n, g = expected["Inpaint"]
        assert n * g >= 0.8 * int(cluster.gpus) - 1e-9


def test_the_heavy_share_and_the_actors_can_be_set():
    inpaint_verify = stages("inpaint", "verify")
    half = plan_layout(inpaint_verify, one_node(2), gpus_per_actor=0.4)
    assert table(half) == {"Inpaint": (4, 0.4), "Verify": (1, 0.1)}  # two a GPU, 0.2 left
    two = plan_layout(stages("inpaint"), one_node(8), gpus_per_actor=2)
    assert table(two) == {"Inpaint": (4, 2)}
    forced = plan_layout(inpaint_verify, one_node(4), model_actors=2)
    assert table(forced) == {"Inpaint": (2, 0.9), "Verify": (2, 0.1)}
    assert plan_layout(inpaint_verify, one_node(4), cpu_actors=3).workers == 3
    # on CPU a model stage gets a pool only when asked
    cpu = plan_layout(stages("inpaint", device="cpu"), one_node(0, 4), model_actors=2)
    assert table(cpu) == {"Inpaint": (2, 0)} and cpu.workers == 2
    with pytest.raises(ValueError, match="gpus_per_actor"):
        plan_layout(inpaint_verify, one_node(8), gpus_per_actor=1.5)


def test_a_run_starts_no_more_workers_than_shards_left():
    layout = plan_layout(stages("inpaint", "verify"), one_node(8))
    assert layout.workers > 3
    three = layout.for_shards(3)
    assert three.workers == 3 and three.model_actors == layout.model_actors
    assert three.rule == f"{layout.rule}; at most the 3 shards left to make"
    assert layout.for_shards(1).rule.endswith("; at most the 1 shard left to make")
    for unchanged in (None, 0, layout.workers, layout.workers + 5):
        assert layout.for_shards(unchanged) is layout  # unknown, nothing left, or enough


@pytest.mark.parametrize(
    ("parts", "cluster", "options", "line"),
    [
        (
            ("inpaint", "verify"),
            one_node(0, 8),
            {},
            r"^stage Inpaint \(edit on cuda\) asks for 1 actor x 0.9 GPU and 1 CPU but the "
            r"cluster has no GPU and 8 CPUs on 1 node; run it with --device cpu",
        ),
        (
            ("inpaint", "verify"),
            one_node(1, 8),
            {"gpus_per_actor": 1},
            r"^stage Verify \(verify on cuda\) asks for 1 actor x 0.1 GPU and 1 CPU but the "
            r"cluster has 1 GPU and 8 CPUs on 1 node; 0 fit beside Inpaint 1 x 1; lower",
        ),
        (
            ("inpaint", "verify"),
            one_node(1, 8),
            {"model_actors": 2},
            r"^stage Inpaint \(edit on cuda\) asks for 2 actors x 0.9 GPU .* 1 fit beside "
            r"Verify 2 x 0.1",
        ),
        (
            ("inpaint",),
            Cluster((Node(8, 1), Node(8, 1))),
            {"gpus_per_actor": 2},  # two GPUs, but not on one node
            r"^stage Inpaint \(edit on cuda\) asks for 1 actor x 2 GPU .* 2 GPUs and 16 CPUs "
            r"on 2 nodes; 0 fit",
        ),
        (
            ("inpaint", "verify"),
            one_node(1, 2),
            {},
            r"^the cluster's 2 CPUs leave none for a shard worker after 2 model actors",
        ),
        (
            ("inpaint",),
            one_node(1, 4),
            {"cpu_actors": 4},
            r"^--cpu-actors 4 and 1 model actors \(one CPU each\) ask for 5 CPUs",
        ),
    ],
)
def test_a_layout_the_cluster_cannot_hold_is_one_line(parts, cluster, options, line):
    with pytest.raises(SetupError, match=line) as err:
        plan_layout(stages(*parts), cluster, **options)
    assert "\n" not in str(err.value)


LAMA_VERIFY = SynthConfig(
    image=ImageConfig(method="inpaint", backend="lama"), verify=VerifyConfig(mode="record")
)


def lama_verify(batch: int = 8):
    return plan_stages(LAMA_VERIFY, Runtime(device="cuda", inpaint_batch_size=batch))


def capacity(layout, stage: str) -> float:
    """A stage's items per second: its GPU share over its seconds per item."""
    (row,) = [s for s in layout.to_json()["stages"] if s["stage"] == stage]
    return row["actors"] * row["gpus_per_actor"] / row["seconds_per_item"]


def lama_cost() -> float:
    (inpaint,) = [s for s in lama_verify() if s.resources and s.resources.stage == "Inpaint"]
    return inpaint.resources.cost


@pytest.mark.parametrize("cluster", [one_node(1), one_node(8, 96), None])
def test_verify_keeps_up_at_a_tenth_of_lamas_cost(cluster):
    """Verify at 0.1 of LaMa's cost per item: its capacity is at least twice the inpainter's
    rate (VERIFY_HEADROOM), on 1 GPU, 8 GPUs and 2 nodes of 4, and every actor is placed."""
    cluster = cluster or Cluster((Node(2), Node(12, 4), Node(12, 4)))
    layout = plan_layout(lama_verify(), cluster, stage_costs={"Verify": 0.1 * lama_cost()})
    assert capacity(layout, "Verify") >= 2 * capacity(layout, "Inpaint")
    table_ = table(layout)
    whole = int(cluster.gpus)
    assert table_ == {"Inpaint": (whole, 0.8333), "Verify": (whole, 0.1667)}
    asked = sum(n * g for n, g in table_.values())
    assert asked <= cluster.gpus + 1e-9
    rules = {s["stage"]: s["rule"] for s in layout.to_json()["stages"]}
    assert rules["Verify"].startswith("capacity >= 2 x the heavy stage's rate")


def test_a_tiny_verify_cost_keeps_the_one_per_four_minimum():
    layout = plan_layout(lama_verify(), one_node(8, 96), stage_costs={"Verify": 1e-6})
    assert table(layout) == {"Inpaint": (8, 0.9), "Verify": (2, 0.1)}
    assert capacity(layout, "Verify") >= 2 * capacity(layout, "Inpaint")
    rule = layout.to_json()["stages"][1]["rule"]
    assert rule.endswith("one 0.1 GPU actor per 4 GPUs (2 actors)"), rule


def test_a_middling_cost_takes_more_tenths_before_a_share_per_gpu():
    """Verify at 0.04 of LaMa: 2 x 0.04 x 0.9 = 0.072 GPU per GPU, 8 GPUs: 6 actors of 0.1."""
    layout = plan_layout(lama_verify(), one_node(8, 96), stage_costs={"Verify": 0.04 * lama_cost()})
    assert table(layout) == {"Inpaint": (8, 0.9), "Verify": (6, 0.1)}
    assert capacity(layout, "Verify") >= 2 * capacity(layout, "Inpaint")


def test_the_declared_costs_size_the_coco_layout():
    """The coco config (LaMa, CLIP ViT-L/14): by the FLOP estimates verify costs about 0.74
    of LaMa an item, so it gets an actor on every GPU and more of it than the inpainter."""
    layout = plan_layout(lama_verify(), one_node(8, 96))
    (inpaint, verify) = layout.to_json()["stages"]
    assert (inpaint["actors"], verify["actors"]) == (8, 8)
    assert inpaint["gpus_per_actor"] + verify["gpus_per_actor"] <= 1
    assert 0.7 < verify["seconds_per_item"] / inpaint["seconds_per_item"] < 0.8
    assert capacity(layout, "Verify") >= 2 * capacity(layout, "Inpaint")


def test_a_stage_cost_is_checked_and_a_stage_without_cost_gets_the_minimum():
    from counterfactual.pipelines.options import RayOptions

    assert RayOptions(stage_cost=("Verify=0.004", "Inpaint=0.003")).stage_costs == {
        "Verify": 0.004,
        "Inpaint": 0.003,
    }
    for bad in ("Verify", "Verify=0", "Verify=x", "Verifier=0.1", "Verify=nan"):
        with pytest.raises(ValueError, match=r"^--stage-cost .*: expected STAGE=SECONDS"):
            RayOptions(stage_cost=(bad,))
    layout = plan_layout(lama_verify(), one_node(8, 96), stage_costs={"Inpaint": 0.0})
    assert table(layout) == {"Inpaint": (8, 0.9), "Verify": (2, 0.1)}
    assert "the heavy stage declares no cost" in layout.to_json()["stages"][1]["rule"]
