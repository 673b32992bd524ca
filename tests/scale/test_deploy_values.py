"""The deployment files name what the code reads: the shard tag the queue limits, the environment
variables the settings take, the code location's module. No cluster here: these checks catch a
rename in the code that the Helm values and the local instance file would silently miss."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from memory_dag.config import ENV_FIELDS, ENV_PREFIX
from memory_dag.store.shards import SHARD_TAG, SHARDS_ENV

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def helm_values() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())


def known_variable(name: str) -> bool:
    return name == SHARDS_ENV or (
        name.startswith(ENV_PREFIX) and name.removeprefix(ENV_PREFIX) in ENV_FIELDS
    )


def test_the_queue_keeps_one_run_per_shard_by_the_tag_the_runs_carry() -> None:
    local = yaml.safe_load((DEPLOY / "local" / "dagster.yaml").read_text())
    queued = helm_values()["dagsterDaemon"]["runCoordinator"]
    assert queued["type"] == "QueuedRunCoordinator"
    for limits in (
        queued["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"],
        local["concurrency"]["runs"]["tag_concurrency_limits"],
    ):
        assert {"key": SHARD_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits


def test_the_code_location_names_known_settings_once_for_itself_and_its_run_pods() -> None:
    values = helm_values()
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    module = args[args.index("--module-name") + 1]
    assert hasattr(importlib.import_module(module), "defs")
    code_env = {item["name"]: item["value"] for item in deployment["env"]}
    assert all(known_variable(name) for name in code_env), sorted(code_env)
    # The run pods get the location's settings, volume and mount from the chart (its container
    # context), not from a second list on the launcher that could drift from this one:
    # dagster-k8s adds both lists up, and a setting given twice reaches the pod twice.
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert not {"envVars", "volumes", "volumeMounts"} & set(launcher), sorted(launcher)
    # The shards' volume is mounted where the settings point.
    (mount,) = deployment["volumeMounts"]
    assert mount["name"] in {volume["name"] for volume in deployment["volumes"]}
    assert code_env[ENV_PREFIX + "DB"].startswith(mount["mountPath"] + "/")
    assert code_env[ENV_PREFIX + "WORKSPACE"].startswith(mount["mountPath"] + "/")
