"""Steps declare themselves: the job fields they need, make and drop, and the model they run.
The run's order follows from the needs, a chain refuses an order that cannot work when it is
built, and the Ray layer places stages from the declarations alone."""

from dataclasses import replace

import pytest
from test_stages import records

from counterfactual.image import DiffusersConfig, ImageConfig, LamaConfig
from counterfactual.method.detect import DetectConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.synth.job import PLANNED, Job, planned_fields
from counterfactual.synth.plan import Runtime, SynthConfig, plan
from counterfactual.synth.staging import (
    Chain,
    build_steps,
    check_order,
    group_stages,
    plan_stages,
    plan_steps,
    step_order,
)
from counterfactual.synth.steps import STEPS, Decode, Edit, Encode, Resources, Rewrite, StepSpec
from counterfactual.text import RewriteResult, TextConfig

BLUR = ImageConfig(method="blur")
DETECT = DetectConfig(model="scripted")


@pytest.mark.parametrize(
    ("detect", "text", "verify", "order"),
    [
        (False, "np-removal", False, ("rewrite", "decode", "edit", "encode")),
        (False, "np-removal", True, ("rewrite", "decode", "edit", "verify", "encode")),
        (False, "captioner", False, ("decode", "edit", "rewrite", "encode")),
        (False, "captioner", True, ("decode", "edit", "rewrite", "verify", "encode")),
        (True, "np-removal", False, ("decode", "detect", "select", "rewrite", "edit", "encode")),
        (
            True,
            "captioner",
            True,
            ("decode", "detect", "select", "edit", "rewrite", "verify", "encode"),
        ),
    ],
)
def test_the_order_follows_from_what_the_steps_need(detect, text, verify, order):
    config = SynthConfig(
        image=BLUR,
        text=TextConfig(method=text),
        verify=VerifyConfig(mode="record" if verify else "off"),
        detect=DETECT if detect else None,
    )
    assert step_order(config) == order
    assert tuple(s.name for s in plan_steps(config)) == order
    # the order is one the chain check accepts, and it ends with the sample made
    assert "sample" in check_order(plan_steps(config), planned_fields(config))


def test_a_step_before_what_it_needs_is_refused_when_the_chain_is_built(tmp_path):
    config = SynthConfig(image=ImageConfig(method="zero"))
    with pytest.raises(ValueError, match=r"step encode needs caption, edited, mask, .*\(decode\)"):
        Chain(build_steps(config, ["decode", "encode"]), PLANNED)
    with pytest.raises(ValueError, match=r"step edit needs image, .*\(rewrite\)"):
        Chain(build_steps(config, ["rewrite", "edit", "decode", "encode"]), PLANNED)
    with pytest.raises(ValueError, match="step rewrite needs plan"):  # detected boxes: no plan yet
        Chain(build_steps(config, ["rewrite", "decode", "edit", "encode"]), ())
    chain = Chain(build_steps(config), PLANNED)  # the run's own order works
    recs = records(tmp_path, 2)
    jobs = [Job(0, k, item) for k, p in enumerate(plan(recs, config)) for item in p]
    assert all(job.sample is not None for job in chain(jobs))


def test_a_step_that_drops_what_a_later_one_needs_is_refused():
    # Edit keeps the original only when Verify will compare it with the edit
    off = Edit.declare(SynthConfig(image=BLUR))
    on = Edit.declare(SynthConfig(image=BLUR, verify=VerifyConfig(mode="record")))
    assert off.drops == {"image"} and on.drops == frozenset()
    verify = StepSpec("verify", needs=frozenset({"image", "edited", "caption", "plan"}))
    rewrite = Rewrite.declare(SynthConfig())
    with pytest.raises(ValueError, match="step verify needs image"):
        check_order([Decode.declare(SynthConfig()), off, rewrite, verify], PLANNED)
    check_order([Decode.declare(SynthConfig()), on, rewrite, verify], PLANNED)


def test_a_need_no_step_makes_is_a_clear_error(monkeypatch):
    needy = StepSpec("encode", needs=frozenset({"verify"}), makes=frozenset({"sample"}))
    monkeypatch.setattr(Encode, "declare", classmethod(lambda cls, config, runtime=None: needy))
    with pytest.raises(ValueError, match=r"no step of this run makes .*encode \(verify\)"):
        step_order(SynthConfig())


def test_resources_are_read_from_the_config_and_the_runtime():
    from counterfactual.synth import costs
    from counterfactual.synth.costs import inpaint_cost

    config = SynthConfig(
        image=ImageConfig(backend="diffusers", diffusers=DiffusersConfig(model="sd")),
        text=TextConfig(method="captioner", model="blip"),
    )
    runtime = Runtime(device="cuda:1", inpaint_batch_size=4, text_batch_size=8)
    by_name = {spec.name: spec.resources for spec in plan_steps(config, runtime)}
    sd2 = inpaint_cost(config.image).seconds  # SD 2's: 30 steps with guidance, 512 px
    assert by_name == {
        "decode": None,
        "edit": Resources("Inpaint", "sd", "--inpaint-model", "cuda:1", 4, heavy=True, cost=sd2),
        "rewrite": Resources(
            "Caption", "blip", "--captioner-model", "cuda:1", 8, cost=costs.CAPTION.seconds
        ),
        "encode": None,
    }
    assert plan_steps(config)[1].resources == Resources(
        "Inpaint", "sd", "--inpaint-model", "cpu", 1, heavy=True, cost=sd2
    )
    assert Edit.declare(SynthConfig(image=ImageConfig(backend="opencv"))).resources is None
    lama = ImageConfig(backend="lama", lama=LamaConfig(model="big-lama.pt"))
    assert Edit.declare(SynthConfig(image=lama)).resources.model == "big-lama.pt"
    assert [cls.name for cls in STEPS] == [
        "rewrite",
        "decode",
        "detect",
        "select",
        "edit",
        "verify",
        "encode",
    ]


def test_stages_are_grouped_from_the_declarations(monkeypatch):
    """The Ray layer knows no step names: a step that declares a model gets a stage (and an
    actor class) of the name it declares, on the device it declares."""
    from counterfactual.pipelines.actors import actor_class
    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import layout_actors
    from counterfactual.synth.layout import Cluster
    from counterfactual.synth.staging import SetupError

    fancy = Resources("Fancy", "m", "--fancy-model", "cuda", 3)
    original = Decode.declare

    def declare(cls, config, runtime=None):
        return replace(original(config, runtime), resources=fancy)

    monkeypatch.setattr(Decode, "declare", classmethod(declare))
    stages = plan_stages(SynthConfig(image=BLUR))
    assert [(s.steps, s.uses_model) for s in stages] == [
        (("rewrite",), False),
        (("decode",), True),
        (("edit", "encode"), False),
    ]
    assert stages[1].resources == fancy and stages[2].given == {
        "plan",
        "objects",
        "caption",
        "image",
    }
    layout = layout_actors(stages, RayOptions(), Cluster.single(4, 2))
    assert layout.model_actors == (0, 2, 0) and layout.gpus == (0.0, 1.0, 0.0)
    assert layout.stages == (None, "Fancy", None)
    with pytest.raises(
        SetupError, match=r"stage Fancy \(decode on cuda\) asks for 1 actor x 1 GPU"
    ):
        layout_actors(stages, RayOptions(), Cluster.single(4, 0))
    assert actor_class("Fancy").__name__ == "Fancy" and actor_class("Fancy") is actor_class("Fancy")
    # on CPU the model step stays in the workers unless model actors are asked for
    on_cpu = replace(stages[1].specs[0], resources=replace(fancy, device="cpu"))
    cpu = [stages[0], replace(stages[1], specs=(on_cpu,)), stages[2]]
    cpus = Cluster.single(4)
    assert layout_actors(cpu, RayOptions(), cpus).model_actors == (0, 0, 0)
    assert layout_actors(cpu, RayOptions(model_actors=2), cpus).model_actors == (0, 2, 0)


def test_group_stages_checks_the_order():
    encode = Encode.declare(SynthConfig())
    with pytest.raises(ValueError, match="step encode needs"):
        group_stages([encode], PLANNED)


class FlakyRewriter:
    """Fails like a model on any batch holding a caption with "cat"."""

    def __init__(self):
        self.calls = []

    def describe(self):
        return {"method": "flaky"}

    def __call__(self, batch):
        self.calls.append(len(batch))
        if any("cat" in r.caption for r in batch):
            raise RuntimeError("device-side assert")
        return [RewriteResult("A PICTURE.", ("x",)) for r in batch]  # names no removed class


def test_rewrite_retries_one_by_one_like_every_model_step(tmp_path):
    config = SynthConfig(image=ImageConfig(method="zero"))
    recs = records(tmp_path, 4)  # record 2's caption names a cat
    jobs = [Job(0, k, item) for k, p in enumerate(plan(recs, config)) for item in p]
    rewriter = FlakyRewriter()
    (step,) = build_steps(config, ["rewrite"], rewriter=rewriter)
    done = step(jobs)
    assert rewriter.calls == [4, 1, 1, 1, 1]  # the batch, then each alone
    failed = [(j.item.record.image_id, j.failure.reason) for j in done if not j.ok]
    assert failed == [("2", "model-error")]
    assert "device-side assert" in next(j for j in done if not j.ok).failure.detail
    assert all(j.caption.text.isupper() for j in done if j.ok)
