"""The Ray cluster-launcher config users stand a cluster up with
(``counterfactual/pipelines/cluster/gpu.yaml``, issue 35 point 9): valid against the schema the installed Ray ships, set up by the project's own
install and model pull, with every placeholder explained in docs/cluster.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")
ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "counterfactual" / "pipelines" / "cluster" / "gpu.yaml"


def ray_schema() -> dict:
    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def cluster() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


def test_the_cluster_config_is_valid_for_the_installed_ray():
    jsonschema.validate(cluster(), ray_schema())


def test_the_schema_check_can_fail():
    """A key Ray does not know, and a node type without its node_config, are refused."""
    config = cluster() | {"setup_command": ["make install"]}
    with pytest.raises(jsonschema.ValidationError, match="setup_command"):
        jsonschema.validate(config, ray_schema())
    config = cluster()
    del config["available_node_types"]["gpu"]["node_config"]
    with pytest.raises(jsonschema.ValidationError, match="node_config"):
        jsonschema.validate(config, ray_schema())


def test_nodes_run_the_projects_install_and_model_pull_and_ray_from_its_venv():
    config = cluster()
    assert "cd ~/counterfactual && make install" in config["setup_commands"]
    assert config["head_setup_commands"] == [
        "cd ~/counterfactual && make models DATASET=coco TO=/shared/models"
    ]
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("~/counterfactual/.venv/bin/ray " in c for c in starts)
    assert config["head_node_type"] in config["available_node_types"]
    assert config["available_node_types"]["gpu"]["min_workers"] >= 1


def test_every_placeholder_is_explained_in_the_docs():
    placeholders = set(re.findall(r"<[A-Z_]+>", CLUSTER.read_text()))
    page = (ROOT / "docs" / "cluster.md").read_text()
    table = page[page.index("## A cluster with `ray up`") :]
    assert placeholders == {
        "<REGION>",
        "<IMAGE_ID>",
        "<HEAD_INSTANCE_TYPE>",
        "<GPU_INSTANCE_TYPE>",
        "<MOUNT_SHARED_STORAGE>",
    }
    for name in placeholders:
        assert f"`{name}`" in table, name
    for step in (
        "ray up counterfactual/pipelines/cluster/gpu.yaml",
        "make synth DATASET=coco",
        "ray down",
    ):
        assert step in table
