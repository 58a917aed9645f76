"""How a run on Ray spreads its work over the cluster: :class:`RayOptions` (none of it changes
the output)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from counterfactual.messages import short
from counterfactual.options import declare

MODEL_STAGES = ("Inpaint", "Verify", "Detect", "Caption")
"""The model stages a ``--stage-cost`` may name (``steps.Resources.stage``)."""


@dataclass(frozen=True, slots=True)
class RayOptions:
    """How the work is spread over the cluster; none of it changes the output.

    ``cpu_actors``: shard workers (default: the cluster's CPUs left after the model actors).
    ``model_actors``: actors per model stage, ``gpus_per_actor``: GPUs per actor of the heavy
    stage (default: :func:`~counterfactual.synth.layout.plan_layout`'s rules; on CPU no model
    actors, the workers run the models themselves, unless ``model_actors`` is set).
    ``model_batch_size``: items per model call (default: the step's own batch size).
    ``stage_cost``: ``STAGE=SECONDS`` per item on one GPU, over the stages' declared costs
    (:mod:`counterfactual.synth.costs`), which size the light stages (``stage_costs``).
    ``in_flight``: tasks queued per worker. ``address``: a cluster to join (default:
    ``RAY_ADDRESS``, else local). ``num_cpus`` and ``dashboard`` apply to a local Ray only.
    ``place_timeout``: seconds an actor may wait for the cluster to place it;
    ``load_timeout``: seconds it may take to load its model; past either the run ends with
    one line. ``verbose``: Ray's own logs and worker output on the driver's terminal.
    ``keep_ray_logs``: keep the folder a local Ray wrote its session logs in (outside OUT, in
    the system temp dir: :func:`ray_temp_dir`) instead of removing it at the end of the run.
    """

    cpu_actors: int | None = declare(
        None,
        help="shard workers (default: the cluster's CPUs left after the model actors)",
        kind="positive_int",
    )
    model_actors: int | None = declare(
        None,
        help="actors per model stage (default: the inpainter one per GPU, a light stage by "
        "its cost per item, at least one per 4 GPUs; on CPU none, the shard workers run the "
        "models themselves)",
        kind="positive_int",
    )
    gpus_per_actor: float | None = declare(
        None,
        help="GPUs per actor of the heavy stage (the inpainter), in (0, 8]; a fraction shares "
        "one GPU (default: one actor per GPU, leaving the light stages' shares: detector, "
        "captioner, verifier; see --stage-cost)",
        kind="gpu_share",
    )
    stage_cost: tuple[str, ...] = declare(
        (),
        help="a model stage's measured seconds per item on one GPU, which sizes its actors "
        "against the inpainter's (e.g. Verify=0.004; stages: Inpaint, Verify, Detect, "
        "Caption; default: FLOP-based estimates, see synth --dry-run)",
        nargs="+",
        metavar="STAGE=SECONDS",
    )
    model_batch_size: int | None = declare(
        None,
        help="items per model call (default: each model step's own batch size)",
        kind="positive_int",
    )
    address: str | None = declare(
        None, help="cluster to join (default: RAY_ADDRESS)", flags=("--ray-address",)
    )
    num_cpus: int | None = declare(
        None, help="CPUs of a local Ray (default: all of this machine's)", kind="positive_int"
    )
    dashboard: bool = declare(
        True,
        help="do not start the Ray dashboard (local Ray)",
        kind="no-flag",
        flags=("--no-dashboard",),
        dest="dashboard",
    )
    in_flight: int = declare(
        2, help="shard tasks queued per worker (default %(default)s)", kind="positive_int"
    )
    place_timeout: float = declare(
        120.0,
        help="seconds an actor may wait for the cluster to place it before the run ends with "
        "one line (default: %(default)g)",
        kind="positive_float",
    )
    load_timeout: float = declare(
        1800.0,
        help="seconds a placed actor may take to load its model (default: %(default)g)",
        kind="positive_float",
    )
    call_timeout: float = declare(
        300.0,
        help="seconds a shard worker waits for one model batch before it sends the batch to "
        "another actor of the stage (the bound is the larger of this and 20 times the slowest "
        "batch the worker has seen; default: %(default)g)",
        kind="positive_float",
    )
    failure_window: int = declare(
        200,
        help="a model stage's last items looked at: more than half of them failed with "
        "model-error ends the run with one line (default: %(default)s)",
        kind="positive_int",
    )
    verbose: bool = declare(
        False,
        help="Ray's own logs and the workers' output on this terminal",
        kind="flag",
        flags=("-v", "--verbose"),
    )
    keep_ray_logs: bool = declare(
        False,
        help="keep the folder a local Ray writes its session logs in (in the system temp dir, "
        "outside OUT; its path is printed at the end and kept in manifest.json) instead of "
        "removing it when the run ends",
        kind="flag",
    )

    def __post_init__(self) -> None:
        names = ("cpu_actors", "model_actors", "model_batch_size", "num_cpus", "in_flight")
        for name in (*names, "failure_window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.gpus_per_actor is not None and not 0 < self.gpus_per_actor <= 8:
            raise ValueError(f"gpus_per_actor must be in (0, 8], got {self.gpus_per_actor}")
        self.stage_costs  # noqa: B018  (refuses a bad --stage-cost now)
        for name in ("place_timeout", "load_timeout", "call_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")

    @property
    def stage_costs(self) -> dict[str, float]:
        """``stage_cost`` as seconds per item by stage name; a ``ValueError`` naming a value
        that is not ``STAGE=SECONDS`` with a known stage and seconds > 0."""
        out: dict[str, float] = {}
        for text in self.stage_cost:
            stage, sep, seconds = str(text).partition("=")
            try:
                value = float(seconds)
            except ValueError:
                value = math.nan
            if not sep or stage not in MODEL_STAGES or not (math.isfinite(value) and value > 0):
                raise ValueError(
                    f"--stage-cost {short(text)}: expected STAGE=SECONDS with STAGE one of "
                    f"{', '.join(MODEL_STAGES)} and SECONDS > 0"
                )
            out[stage] = value
        return out
