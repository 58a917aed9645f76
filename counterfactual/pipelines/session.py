"""A run's Ray session: starting or joining Ray (:func:`init_ray`, one line when it does not
start), the folder a local Ray keeps its files in outside OUT (:func:`ray_temp_dir`, removed by
:func:`stop_ray`, or by a later run when the process that made it was killed), the cluster's
shape and layout, and the check that every node sees the local model files."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from counterfactual import fs
from counterfactual.messages import one_line
from counterfactual.pipelines.options import RayOptions
from counterfactual.synth.layout import Cluster, Layout, Node, plan_layout
from counterfactual.synth.runlock import pid_running, pid_start
from counterfactual.synth.staging import (
    SetupError,
    Stage,
)


def init_ray(
    work_dir: fs.PathLike | None, options: RayOptions, temp_dir: Path | None = None
) -> dict[str, Any]:
    """Start or join Ray once per process; return what the manifest records about it.
    A local Ray keeps its session files, logs and sockets in ``temp_dir``, else in
    ``WORK/.ray`` when that path is short enough for Ray's sockets, else in a fresh
    :func:`ray_temp_dir`."""
    import ray

    dashboard = None
    plain_ray_lines()
    if not ray.is_initialized():
        quiet = {} if options.verbose else {"log_to_driver": False, "logging_level": logging.ERROR}
        address = options.address or os.environ.get("RAY_ADDRESS")
        try:
            if address:
                ctx = ray.init(address=address, **quiet)
            else:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                ctx = ray.init(
                    num_cpus=options.num_cpus,
                    include_dashboard=options.dashboard and _has_dashboard(),
                    dashboard_host="127.0.0.1",
                    _temp_dir=str(temp_dir or work_ray_dir(work_dir) or ray_temp_dir()),
                    **quiet,
                )
        except Exception as err:  # noqa: BLE001  (ray.init raises bare Exception: a node timeout)
            ray.shutdown()  # whatever part of a local Ray came up
            raise ray_start_failure(err, address, options) from err
        dashboard = ctx.dashboard_url or None
        if dashboard and "://" not in dashboard:
            dashboard = f"http://{dashboard}"
    context = ray.get_runtime_context()
    resources = ray.cluster_resources()
    return {
        "address": context.gcs_address,
        "dashboard": dashboard,
        "cpus": resources.get("CPU", 0.0),
        "gpus": resources.get("GPU", 0.0),
        "nodes": {n["NodeID"]: n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")},
        "version": ray.__version__,
    }


def ray_start_failure(err: BaseException, address: str | None, options: RayOptions) -> SetupError:
    """Why Ray did not start, and what to try, as one line: joining ``address`` (from
    ``--ray-address`` or ``RAY_ADDRESS``), or starting a local Ray."""
    cause = f"{type(err).__name__}: {one_line(err, 240)}"
    if address:
        named = "--ray-address" if options.address else "RAY_ADDRESS"
        return SetupError(
            f"Ray did not start: cannot join the cluster at {address!r} ({named}): {cause}; "
            f"check that it runs (ray status) and its address, or unset {named} to start a "
            "local Ray"
        )
    return SetupError(
        f"Ray did not start: a local Ray could not come up: {cause}; check free memory, "
        "/dev/shm and the process limits (ulimit -v, a container's memory), or run in one "
        "process (--runner local) or join a running cluster (--ray-address)"
    )


def plain_ray_lines() -> bool:
    """Ray's own lines on the driver (``(raylet) A worker died ...``) without colour codes
    unless stdout and stderr are terminals (Ray prints them to either): sets
    ``RAY_COLOR_PREFIX=0``, which Ray's printer reads each line, unless the user set it.
    Returns whether the lines are plain."""
    if "RAY_COLOR_PREFIX" not in os.environ and not (_tty(sys.stdout) and _tty(sys.stderr)):
        os.environ["RAY_COLOR_PREFIX"] = "0"
    return os.environ.get("RAY_COLOR_PREFIX") == "0"


def _tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


RAY_DIR_LIMIT = 40
"""The longest folder a local Ray may keep its files in: its unix sockets
(``session_<time>_<pid>/sockets/plasma_store``, ...) must stay under 107 bytes."""


RAY_DIR_OWNER = "cf-owner.json"
"""The file in a :func:`ray_temp_dir` naming the process that made it (host, pid, its start):
a later run removes the folder once that process is gone (:func:`remove_stale_ray_dirs`)."""


def ray_temp_dir() -> Path:
    """A fresh folder ``cf-ray-*`` for a local Ray's session files, logs and sockets, outside
    OUT: in the system temp dir (``TMPDIR``), or in ``/tmp`` when that path is too long for
    Ray's sockets (:data:`RAY_DIR_LIMIT`). :func:`stop_ray` removes it; a killed run's is
    removed by the next run that makes one (:func:`remove_stale_ray_dirs`)."""
    base = tempfile.gettempdir()
    if len(base) + len("/cf-ray-12345678") > RAY_DIR_LIMIT and os.access("/tmp", os.W_OK):
        base = "/tmp"
    remove_stale_ray_dirs(Path(base))
    folder = Path(tempfile.mkdtemp(prefix="cf-ray-", dir=base))
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": pid_start(os.getpid())}
    fs.write_text(folder / RAY_DIR_OWNER, json.dumps(owner))
    return folder


def remove_stale_ray_dirs(base: Path) -> list[Path]:
    """Remove the ``cf-ray-*`` folders in ``base`` that this user's runs left when they were
    killed: those whose :data:`RAY_DIR_OWNER` names a process of this host that is gone. A
    folder without one (being made, or made by an earlier version) or of a live process
    is left. Returns the folders removed."""
    removed = []
    for folder in sorted(base.glob("cf-ray-*")):
        if folder.is_symlink() or not folder.is_dir() or not _owned_by_me(folder):
            continue
        owner = _ray_dir_owner(folder / RAY_DIR_OWNER)
        if owner is None or owner["host"] != socket.gethostname():
            continue
        if pid_running(owner["pid"], owner["pid_start"]):
            continue
        shutil.rmtree(folder, ignore_errors=True)  # links inside are removed, not followed
        removed.append(folder)
    return removed


def _owned_by_me(folder: Path) -> bool:
    try:
        return folder.lstat().st_uid == os.getuid()
    except (OSError, AttributeError):  # gone, or no uids (Windows)
        return False


def _ray_dir_owner(path: Path) -> dict[str, Any] | None:
    """A :data:`RAY_DIR_OWNER` file's host, pid and start, ``None`` when it is missing or not
    one."""
    if path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    start = data.get("pid_start")
    return {
        "host": data.get("host"),
        "pid": data["pid"],
        "pid_start": start if isinstance(start, int) else None,
    }


def work_ray_dir(work_dir: fs.PathLike | None) -> Path | None:
    """``WORK/.ray`` when WORK is a local folder whose path is short enough for Ray's sockets."""
    if work_dir is None or fs.is_url(work_dir):
        return None
    path = Path(fs.as_path(work_dir)).resolve() / ".ray"
    if len(str(path)) > RAY_DIR_LIMIT:
        return None
    path.mkdir(parents=True, exist_ok=True)
    return path


def stop_ray(temp_dir: Path, keep_logs: bool = False) -> str | None:
    """Shut down the local Ray this process started in ``temp_dir`` (:func:`ray_temp_dir`) and
    remove the folder, or, with ``keep_logs``, keep it and return where its logs are."""
    import ray

    ray.shutdown()
    if keep_logs:
        return str(temp_dir / "session_latest" / "logs")
    for _ in range(3):  # a worker still exiting may write one more log line
        shutil.rmtree(temp_dir, ignore_errors=True)
        if not temp_dir.exists():
            break
        time.sleep(0.2)
    return None


def _has_dashboard() -> bool:
    try:
        import aiohttp  # noqa: F401  (ray[default] installs it with the dashboard)
    except ImportError:
        return False
    return True


def cluster_shape() -> Cluster:
    """The alive nodes of the Ray this process is connected to, with their CPUs and GPUs."""
    import ray

    nodes = []
    for node in ray.nodes():
        if node.get("Alive"):
            res = node.get("Resources") or {}
            nodes.append(Node(float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))))
    return Cluster(tuple(nodes))


def _missing_here(paths: dict[str, str]) -> tuple[str, dict[str, str]]:
    """On one node: its address and which of ``paths`` (option -> path) it does not see."""
    import ray

    address = ray.util.get_node_ip_address()
    return address, {option: p for option, p in paths.items() if not os.path.exists(p)}


def check_model_paths(paths: dict[str, str], gpu_only: bool, timeout: float) -> list[str]:
    """Every local model path (option -> absolute path) looked at on every alive node that may
    load it (with ``gpu_only`` the nodes with GPUs), by a task pinned to each node; the
    addresses of the nodes looked at, or :class:`SetupError` (one line) naming a path a node
    lacks, or a node that did not answer within ``timeout`` seconds."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not paths:
        return []
    nodes = [
        n
        for n in ray.nodes()
        if n.get("Alive") and (not gpu_only or (n.get("Resources") or {}).get("GPU", 0) > 0)
    ]
    look = ray.remote(num_cpus=0)(_missing_here)
    refs = [
        look.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(paths)
        for n in nodes
    ]
    done, late = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if late:
        raise SetupError(
            f"{len(late)} of {len(refs)} nodes did not say within {timeout:g} s "
            "(--place-timeout) whether they see the models; is the cluster busy?"
        )
    answers = ray.get(done)
    lacking = [(address, missing) for address, missing in answers if missing]
    if lacking:
        address, missing = lacking[0]
        option, path = next(iter(missing.items()))
        raise SetupError(
            f"{option} {path}: not on node {address} ({len(lacking)} of {len(answers)} nodes "
            "lack it); put the models on storage every node mounts at the same path (`make "
            "models TO=/shared/models`) and pass that path"
        )
    return [address for address, _ in answers]


def layout_actors(stages: Sequence[Stage], options: RayOptions, cluster: Cluster) -> Layout:
    """The run's layout (:func:`~counterfactual.synth.layout.plan_layout`) under ``options``;
    :class:`SetupError` (one line) when the cluster cannot hold it."""
    return plan_layout(
        stages,
        cluster,
        model_actors=options.model_actors,
        gpus_per_actor=options.gpus_per_actor,
        cpu_actors=options.cpu_actors,
        model_batch_size=options.model_batch_size,
        stage_costs=options.stage_costs,
    )


def owns_ray(options: RayOptions) -> bool:
    """Whether a run starts its own local Ray (none running in this process, no cluster
    named), which it stops and whose folder it removes at its end."""
    import ray

    return not ray.is_initialized() and not (options.address or os.environ.get("RAY_ADDRESS"))
