"""The Helm chart renders what an admin needs, and deploy/manifests is that render.

Rendered with the project's pinned helm (deploy/local/helmbin, built on first use); no
cluster here: tests/e2e/test_deploy.py sends the same renders to an API server.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster import chart, grafana
from localcluster.kube import Obj

from dra.cli.parser import build_parser
from dra.core import labels
from dra.daemon.flags import env_name
from dra.explain.report import standard_device_classes
from dra.fakegpus.profiles import BUILTIN_PROFILES, load_profile
from dra.gpu import driverfiles
from dra.kubeletplugin.miglayout import load_configs

FAKE: dict[str, Any] = {"fakeGpus": {"enabled": True, "nodes": {"gpu-a": "mixed"}}}
KIND_VALUES = chart.KIND / "values.yaml"


def _only(objects: list[Obj], kind: str) -> Obj:
    [found] = [o for o in objects if o["kind"] == kind]
    return found


def _container(objects: list[Obj]) -> Obj:
    containers: list[Obj] = _only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    [container] = containers
    return container


def _env(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    ("values", "files"),
    [
        pytest.param({}, [], id="defaults"),
        pytest.param(FAKE, [], id="fake-gpus"),
        pytest.param({}, [KIND_VALUES], id="kind"),
        pytest.param({"rbac": {"claimEvents": True}, "nvml": {"runtimeClassName": "nvidia"}}, [], id="real"),
        pytest.param({"kubeletPlugin": {"mps": {"enabled": True}}}, [], id="mps"),
        pytest.param({"kubeletPlugin": {"vfio": {"enabled": True}}}, [], id="vfio"),
        pytest.param(
            {"nodeLabeller": {"enabled": True, "adminLabels": {"gpu-type": "{model}"}}},
            [],
            id="node-labeller",
        ),
    ],
)
def test_chart_lints_strictly(values: dict[str, Any], files: list[Path]) -> None:
    output = chart.lint(values, files)
    assert "1 chart(s) linted, 0 chart(s) failed" in output


def test_defaults_render_the_driver_and_nothing_else() -> None:
    objects = chart.template()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "DeviceClass",
        "DeviceClass",
        "DeviceClass",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    namespaced = [o for o in objects if o["kind"] in ("ServiceAccount", "DaemonSet")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"dra-gpu"}


def test_rbac_grants_exactly_what_the_driver_calls() -> None:
    """dra/kube.py: GET claims, apply their status, GET nodes; list/watch/create/PUT/DELETE slices;
    events only when asked."""
    role = _only(chart.template(), "ClusterRole")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("resource.k8s.io",), ("resourceclaims",)): ["get"],
        (("resource.k8s.io",), ("resourceclaims/status",)): ["patch"],
        (("resource.k8s.io",), ("resourceclaims/driver",)): ["associated-node:patch"],
        (("resource.k8s.io",), ("resourceslices",)): ["create", "delete", "list", "patch", "update", "watch"],
        (("",), ("nodes",)): ["get"],
    }
    with_events = _only(chart.template({"rbac": {"claimEvents": True}}), "ClusterRole")
    [driver] = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert driver["resourceNames"] == ["gpu.nvidia.com"], "its own driver's entries only"
    assert with_events["rules"][:5] == role["rules"]
    assert with_events["rules"][5:] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_binding_names_the_daemonsets_service_account() -> None:
    objects = chart.template(release="gpu", namespace="kube-gpu")
    account = _only(objects, "ServiceAccount")["metadata"]["name"]
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    binding = _only(objects, "ClusterRoleBinding")
    assert pod["serviceAccountName"] == account
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "kube-gpu"}]
    assert binding["roleRef"]["name"] == _only(objects, "ClusterRole")["metadata"]["name"]


def test_daemonset_runs_the_kubelet_plugin_on_the_host_paths() -> None:
    objects = chart.template()
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = _container(objects)
    assert container["command"] == ["dra-gpu", "kubelet-plugin"]
    env = _env(container)
    assert env["DRA_GPU_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["DRA_GPU_DRIVER_NAME"] == "gpu.nvidia.com"
    assert env["DRA_GPU_HTTP_ADDRESS"] == ":8080"
    # The kubelet dials the sockets at their host path: the container sees each at the same path.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    host_paths = {name: v["hostPath"]["path"] for name, v in volumes.items() if "hostPath" in v}
    assert host_paths == {
        "plugin-dir": "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        # Read-only: which GPUs device-plugin pods still hold (docs/migration.md).
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "cdi": "/var/run/cdi",
        "host-dev": "/dev",
        # Read-only: the driver's files for CDI specs, found under --host-root; never the host's /.
        **{f"driver-{d.replace('/', '-')}": f"/{d}" for d in (*driverfiles.FILE_DIRS, *driverfiles.IPC_DIRS)},
    }
    assert all(
        mounts[name] == path
        for name, path in host_paths.items()
        if name != "host-dev" and not name.startswith("driver-")
    )
    # The host's /dev, read-only, tells which device nodes to put in CDI specs.
    assert mounts["host-dev"] == "/host/dev"
    assert env["DRA_GPU_HOST_ROOT"] == "/host"
    [dev_mount] = [m for m in container["volumeMounts"] if m["name"] == "host-dev"]
    assert dev_mount["readOnly"] is True
    assert (mounts["driver-usr"], env["DRA_GPU_DRIVER_ROOT"]) == ("/host/usr", "/")
    assert all(m["readOnly"] for m in container["volumeMounts"] if m["name"].startswith("driver-"))
    assert env["DRA_GPU_KUBELET_ROOT"] == "/var/lib/kubelet"
    assert env["DRA_GPU_CDI_ROOT"] == "/var/run/cdi"


def test_daemonset_probes_resources_priority_and_tolerations() -> None:
    objects = chart.template()
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = _container(objects)
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"]["memory"] == "128Mi"
    assert container["resources"]["limits"] == {"memory": "256Mi"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    assert dedicated in pod["tolerations"]
    assert "nodeSelector" not in pod
    assert "affinity" not in pod
    placed = _only(
        chart.template({"nodeSelector": {"nvidia.com/gpu.present": "true"}, "tolerations": []}), "DaemonSet"
    )["spec"]["template"]["spec"]
    assert placed["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "tolerations" not in placed


def test_daemonset_security_context_is_uid0_without_capabilities() -> None:
    objects = chart.template()
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert _container(objects)["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert flag not in pod


def test_mps_adds_only_cap_sys_admin_and_setpcap_and_no_apparmor_profile_to_the_kubelet_plugin() -> None:
    # Each MPS control daemon starts in a mount namespace of its own (dra.kubeletplugin.mpslaunch),
    # from the launcher that alone keeps CAP_SYS_ADMIN; CAP_SETPCAP lets the plugin remove it
    # from its bounding set (dra.kubeletplugin.mpsprivsep, tests/unit/test_mpsprivsep.py).
    objects = chart.template(
        {"kubeletPlugin": {"mps": {"enabled": True}}, "devicePlugin": {"enabled": False}}
    )
    assert _container(objects)["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": True,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "SETPCAP"]},
        "appArmorProfile": {"type": "Unconfined"},
    }


def test_vfio_is_off_by_default_and_when_on_mounts_the_hosts_sys_writable() -> None:
    off = _container(chart.template())
    assert "DRA_GPU_VFIO" not in _env(off)
    assert "host-sys" not in {m["name"] for m in off["volumeMounts"]}
    objects = chart.template({"kubeletPlugin": {"vfio": {"enabled": True}}})
    container = _container(objects)
    assert _env(container)["DRA_GPU_VFIO"] == "true"
    # The plugin writes driver_override, unbind and bind there (dra.adapters.pcisysfs under --host-root).
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "host-sys"]
    assert mount == {"name": "host-sys", "mountPath": "/host/sys"}
    volumes = {v["name"]: v for v in _only(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-sys"]["hostPath"] == {"path": "/sys", "type": "Directory"}
    # No capability is added: sysfs's store methods check the file mode (root's), not capabilities.
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _flags(command: str) -> set[str]:
    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        env_name(option) for action in commands.choices[command]._actions for option in action.option_strings
    }


def test_every_driver_env_var_is_a_kubelet_plugin_flag() -> None:
    objects = chart.template(FAKE, extra=["--set", "logFormat=json"])
    driver_vars = {name for name in _env(_container(objects)) if name.startswith("DRA_GPU_")}
    assert driver_vars <= _flags("kubelet-plugin")
    assert {"DRA_GPU_NODE_NAME", "DRA_GPU_DRIVER_NAME", "DRA_GPU_LOG_FORMAT"} <= driver_vars


SPLIT: dict[str, Any] = {"devicePlugin": {"enabled": True}, "gpuAssignment": {"devicePlugin": "6,7"}}


def test_device_plugin_runs_beside_the_kubelet_plugin_on_the_same_split() -> None:
    pod = _only(chart.template({**SPLIT, **FAKE}), "DaemonSet")["spec"]["template"]["spec"]
    plugin, device_plugin = pod["containers"]
    assert (plugin["name"], device_plugin["name"]) == ("kubelet-plugin", "device-plugin")
    assert device_plugin["command"] == ["dra-gpu", "device-plugin"]
    assert device_plugin["args"] == plugin["args"] == ["--fake-gpus=/etc/dra-gpu/fake-gpus/profiles.yaml"]
    for container in (plugin, device_plugin):
        assert _env(container)["DRA_GPU_DEVICE_PLUGIN_GPUS"] == "6,7"
        assert "DRA_GPU_DRA_GPUS" not in _env(container)
    dp_env = _env(device_plugin)
    assert {name for name in dp_env if name.startswith("DRA_GPU_")} <= _flags("device-plugin")
    assert (dp_env["DRA_GPU_RESOURCE_NAME"], dp_env["DRA_GPU_DEVICE_LIST_STRATEGY"]) == (
        "nvidia.com/gpu",
        "cdi-cri",
    )
    assert dp_env["DRA_GPU_HTTP_ADDRESS"] == ":8081"
    assert device_plugin["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-dp"}
    mounts = {m["name"]: m["mountPath"] for m in device_plugin["volumeMounts"]}
    # The kubelet's socket directory, and the state directory that holds the shared GPU record.
    assert mounts["device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert mounts["plugin-dir"] == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    assert mounts["cdi"] == "/var/run/cdi"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["device-plugins"]["hostPath"] == {
        "path": "/var/lib/kubelet/device-plugins",
        "type": "Directory",
    }


def test_the_device_plugin_directory_is_the_kubelets_constant_whatever_its_root() -> None:
    values = {**SPLIT, **FAKE, "kubeletDir": "/var/lib/k0s/kubelet"}
    pod = _only(chart.template(values), "DaemonSet")["spec"]["template"]["spec"]
    device_plugin = pod["containers"][1]
    mounts = {m["name"]: m["mountPath"] for m in device_plugin["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # k8s.io/kubelet's deviceplugin/v1beta1 DevicePluginPath, not under --root-dir.
    assert mounts["device-plugins"] == volumes["device-plugins"]["hostPath"]["path"]
    assert mounts["device-plugins"] == _env(device_plugin)["DRA_GPU_DEVICE_PLUGIN_DIR"]
    assert mounts["device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert mounts["plugin-dir"] == "/var/lib/k0s/kubelet/plugins/gpu.nvidia.com"


def test_device_plugin_alone_takes_every_gpu() -> None:
    pod = _only(
        chart.template({"kubeletPlugin": {"enabled": False}, "devicePlugin": {"enabled": True}}), "DaemonSet"
    )["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["name"] == "device-plugin"
    assert not {"DRA_GPU_DRA_GPUS", "DRA_GPU_DEVICE_PLUGIN_GPUS"} & set(_env(container))


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"devicePlugin": {"enabled": True}}, "set gpuAssignment.dra or gpuAssignment.devicePlugin"),
        ({"kubeletPlugin": {"enabled": False}}, "enable kubeletPlugin, devicePlugin or both"),
        (
            {
                "kubeletPlugin": {"enabled": False},
                "devicePlugin": {"enabled": True},
                "deviceClasses": {"gpu": {"extendedResourceName": "nvidia.com/gpu"}},
            },
            "deviceClasses.gpu.extendedResourceName and devicePlugin.resourceName are both nvidia.com/gpu",
        ),
        (
            {**FAKE, "kubeletPlugin": {"vfio": {"enabled": True}}},
            "kubeletPlugin.vfio.enabled needs real GPUs",
        ),
    ],
)
def test_impossible_container_choices_fail_the_render(values: dict[str, Any], complaint: str) -> None:
    with chart.values_flags(values) as flags:
        result = chart.helm("template", "dra-gpu", str(chart.CHART), *flags, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_driver_files_come_from_the_driver_root_or_are_left_to_the_hook() -> None:
    def mounts_and_env(values: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        container = _container(chart.template(values))
        return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}, _env(container)

    mounts, env = mounts_and_env({"driverFiles": {"root": "/run/nvidia/driver"}})
    assert {name: path for name, path in mounts.items() if name.startswith("driver-")} == {
        "driver-root": "/host/run/nvidia/driver"
    }
    assert (env["DRA_GPU_DRIVER_ROOT"], env["DRA_GPU_CDI_DRIVER_FILES"]) == ("/run/nvidia/driver", "true")
    mounts, env = mounts_and_env({"driverFiles": {"enabled": False}})
    assert not [name for name in mounts if name.startswith("driver-")]
    assert env["DRA_GPU_CDI_DRIVER_FILES"] == "false"


def test_real_gpus_get_nvml_through_the_toolkit_or_a_runtime_class() -> None:
    default = _only(chart.template(), "DaemonSet")["spec"]["template"]["spec"]
    env = _env(default["containers"][0])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # compute brings nvidia-cuda-mps-control, which MPS claims need.
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "runtimeClassName" not in default
    nvidia = chart.template({"nvml": {"runtimeClassName": "nvidia", "toolkitEnv": False}})
    pod = _only(nvidia, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert "NVIDIA_VISIBLE_DEVICES" not in _env(pod["containers"][0])


def test_fake_gpus_mount_a_per_node_map_and_skip_nvml() -> None:
    objects = chart.template({**FAKE, "nvml": {"runtimeClassName": "nvidia"}})
    config = _only(objects, "ConfigMap")
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["--fake-gpus=/etc/dra-gpu/fake-gpus/profiles.yaml"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "fake-gpus"]
    assert mount == {"name": "fake-gpus", "mountPath": "/etc/dra-gpu/fake-gpus", "readOnly": True}
    [volume] = [v for v in pod["volumes"] if v["name"] == "fake-gpus"]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    assert "runtimeClassName" not in pod
    assert "NVIDIA_VISIBLE_DEVICES" not in _env(container)
    assert "DRA_GPU_HOST_ROOT" not in _env(container)
    assert "host-dev" not in {v["name"] for v in pod["volumes"]}
    assert yaml.safe_load(config["data"]["profiles.yaml"]) == {
        "default": "h100x8",
        "nodes": {"gpu-a": "mixed"},
    }
    assert "checksum/fake-gpus" in _only(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]


def test_fake_gpu_map_is_what_the_driver_reads(tmp_path: Path) -> None:
    """The rendered ConfigMap, read by the driver's own loader on three nodes."""
    inline = {"gpus": [{"model": "t4", "count": 3}]}
    values = {"fakeGpus": {"enabled": True, "profile": "a100x4-mig", "nodes": {"n1": "mixed", "n2": inline}}}
    config = _only(chart.template(values), "ConfigMap")
    path = tmp_path / "profiles.yaml"
    path.write_text(config["data"]["profiles.yaml"])
    assert load_profile(str(path), "n1").name == "mixed"
    assert [g.model.product_name for g in load_profile(str(path), "n2").gpus] == ["Tesla T4"] * 3
    assert load_profile(str(path), "n3").name == "a100x4-mig"
    assert set(BUILTIN_PROFILES) >= {"h100x8", "h100x8-mig", "mixed"}


def test_device_classes_follow_the_driver_name() -> None:
    names = {"gpu": {"name": "g"}, "mig": {"name": "m"}, "vfio": {"name": "v"}}
    values = {"driverName": "gpu.example.com", "deviceClasses": names}
    classes = {c["metadata"]["name"]: c for c in chart.template(values) if c["kind"] == "DeviceClass"}
    assert sorted(classes) == ["g", "m", "v"]
    [selector] = classes["v"]["spec"]["selectors"]
    assert selector["cel"]["expression"] == (
        'device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].type == "vfio"'
    )
    [selector] = classes["m"]["spec"]["selectors"]
    assert selector["cel"]["expression"] == (
        'device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].type == "mig"'
    )
    defaults = [c["metadata"]["name"] for c in chart.template() if c["kind"] == "DeviceClass"]
    assert defaults == ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"]
    assert not [
        c for c in chart.template({"deviceClasses": {"enabled": False}}) if c["kind"] == "DeviceClass"
    ]


def test_device_classes_serve_an_extended_resource_only_when_asked() -> None:
    def names(values: dict[str, Any] | None = None) -> dict[str, str | None]:
        return {
            c["metadata"]["name"]: c["spec"].get("extendedResourceName")
            for c in chart.template(values)
            if c["kind"] == "DeviceClass"
        }

    assert names() == {"gpu.nvidia.com": None, "mig.nvidia.com": None, "vfio.gpu.nvidia.com": None}
    values: dict[str, Any] = {"deviceClasses": {"gpu": {"extendedResourceName": "nvidia.com/gpu"}}}
    assert names(values) == {
        "gpu.nvidia.com": "nvidia.com/gpu",
        "mig.nvidia.com": None,
        "vfio.gpu.nvidia.com": None,
    }
    # Beside a device plugin serving another name, the mapping is fine.
    values |= {"devicePlugin": {"enabled": True, "resourceName": "nvidia.com/legacy-gpu"}}
    values |= {"gpuAssignment": {"devicePlugin": "7"}}
    assert names(values)["gpu.nvidia.com"] == "nvidia.com/gpu"


def test_admission_policy_applies_to_the_drivers_account_only() -> None:
    objects = chart.template(release="gpu", namespace="kube-gpu")
    account = _only(objects, "ServiceAccount")["metadata"]["name"]
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [o["spec"] for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["policyName"] for b in bindings) == sorted(policies)
    assert all(b["validationActions"] == ["Deny"] for b in bindings)
    for policy in policies.values():
        [condition] = policy["spec"]["matchConditions"]
        assert (
            condition["expression"]
            == f'request.userInfo.username == "system:serviceaccount:kube-gpu:{account}"'
        )
    [rule] = policies["gpu-dra-gpu-own-node-slices"]["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    [rule] = policies["gpu-dra-gpu-own-claim-status"]["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceclaims/status"]
    assert rule["operations"] == ["UPDATE"]
    disabled = chart.template({"admissionPolicy": {"enabled": False}})
    assert not [o for o in disabled if o["kind"].startswith("ValidatingAdmissionPolicy")]


def test_namespace_is_rendered_only_when_asked_and_allows_host_paths() -> None:
    assert not [o for o in chart.template() if o["kind"] == "Namespace"]
    namespace = _only(chart.template({"namespace": {"create": True}}), "Namespace")
    assert namespace["metadata"]["name"] == "dra-gpu"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_another_kubelet_root_moves_sockets_and_mounts() -> None:
    objects = chart.template({"kubeletDir": "/var/lib/k0s/kubelet"})
    container = _container(objects)
    assert _env(container)["DRA_GPU_KUBELET_ROOT"] == "/var/lib/k0s/kubelet"
    mounts = sorted(m["mountPath"] for m in container["volumeMounts"])
    assert "/var/lib/k0s/kubelet/plugins/gpu.nvidia.com" in mounts
    assert "/var/lib/k0s/kubelet/plugins_registry" in mounts


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        pytest.param({"fakeGpu": {"enabled": True}}, "fakeGpu", id="misspelt-key"),
        pytest.param({"driverName": "GPU_Nvidia"}, "driverName", id="bad-driver-name"),
        pytest.param({"logLevel": "verbose"}, "logLevel", id="bad-log-level"),
        pytest.param(
            {"deviceClasses": {"gpu": {"extendedResourceName": "gpu"}}},
            "extendedResourceName",
            id="extended-resource-without-domain",
        ),
        pytest.param({"unhealthyTaintEffect": "Evict"}, "unhealthyTaintEffect", id="bad-taint-effect"),
        pytest.param(
            {"kubeletPlugin": {"claimMetricsInterval": -1}}, "claimMetricsInterval", id="negative-interval"
        ),
        pytest.param({"grafanaDashboard": {"label": {"a": "b"}}}, "label", id="misspelt-dashboard-key"),
        pytest.param({"kubeletPlugin": {"consumableShares": "0"}}, "consumableShares", id="zero-shares"),
        pytest.param({"kubeletPlugin": {"consumableShares": "gpu"}}, "consumableShares", id="bad-share-mode"),
    ],
)
def test_values_schema_rejects_mistakes(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(chart.HelmError, match=complaint):
        chart.template(values)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        pytest.param({"image": {"tag": "v1 2; rm -rf /"}}, "at '/image/tag'", id="tag-with-spaces"),
        pytest.param(
            {"image": {"repository": "a" * 100_000}}, "at '/image/repository'", id="100kb-repository"
        ),
        pytest.param(
            {"image": {"repository": "Registry/UPPER"}}, "at '/image/repository'", id="uppercase-path"
        ),
        pytest.param(
            {"resources": {"limits": {"memory": "lots"}}}, "at '/resources/limits/memory'", id="lots"
        ),
        pytest.param({"resources": {"requests": [1, 2]}}, "at '/resources/requests'", id="requests-a-list"),
        pytest.param({"resources": {"limits": {"cpu": -1}}}, "at '/resources/limits/cpu'", id="negative-cpu"),
        pytest.param(
            {"resources": {"limit": {"cpu": 1}}}, "additional properties 'limit'", id="misspelt-limits"
        ),
        pytest.param(
            {"webhook": {"resources": {"requests": {"memory": "1 Gi"}}}},
            "at '/webhook/resources/requests/memory'",
            id="webhook-quantity",
        ),
        pytest.param({"priorityClassName": "a b"}, "at '/priorityClassName'", id="priority-class-with-space"),
        pytest.param(
            {"priorityClassName": "x" * 254}, "at '/priorityClassName'", id="priority-class-too-long"
        ),
        pytest.param({"updateStrategy": {"type": "Bogus"}}, "at '/updateStrategy/type'", id="bogus-strategy"),
        pytest.param(
            {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "half"}}},
            "at '/updateStrategy/rollingUpdate/maxUnavailable'",
            id="max-unavailable-no-percentage",
        ),
        pytest.param(
            {"podMonitor": {"namespace": "Monitoring"}}, "at '/podMonitor/namespace'", id="namespace"
        ),
        pytest.param(
            {"grafanaDashboard": {"namespace": "a.b"}},
            "at '/grafanaDashboard/namespace'",
            id="dotted-namespace",
        ),
        pytest.param({"podLabels": {"team": "a b"}}, "at '/podLabels/team'", id="label-value"),
        pytest.param({"nodeSelector": {"a b": "x"}}, "invalid propertyName 'a b'", id="label-key"),
        pytest.param({"serviceAccount": {"name": "A_b"}}, "at '/serviceAccount/name'", id="service-account"),
        pytest.param(
            {"nvml": {"runtimeClassName": "nvidia runtime"}}, "at '/nvml/runtimeClassName'", id="rtclass"
        ),
        pytest.param(
            {"imagePullSecrets": ["regcred"]}, "at '/imagePullSecrets/0'", id="pull-secret-a-string"
        ),
    ],
)
def test_values_schema_checks_what_the_api_server_and_kubelet_check(
    values: dict[str, Any], complaint: str
) -> None:
    # Each value would render, for the API server (or the kubelet, pulling) to refuse later.
    with chart.values_flags(values) as flags:
        result = chart.helm("template", "dra-gpu", str(chart.CHART), *flags, check=False)
    assert result.returncode != 0
    problems = [line for line in result.stderr.splitlines() if line.lstrip().startswith("- at ")]
    assert any(complaint in line for line in problems), result.stderr
    # One line each, whatever the value's size: a 100 KB repository is not printed back.
    assert len(result.stderr) < 2000, result.stderr[:2000]


@pytest.mark.parametrize(
    "values",
    [
        {"image": {"repository": "registry.example.com:5000/team/dra-gpu", "tag": "v0.1.0-rc.1_x"}},
        {"resources": {"requests": {"cpu": "0.5", "memory": 134217728}, "limits": {"memory": "1e9"}}},
        {"resources": {"limits": {"nvidia.com/gpu": 0, "hugepages-2Mi": "2Mi", "cpu": "1500m"}}},
        {"updateStrategy": {"type": "OnDelete"}},
        {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}},
        {"priorityClassName": "", "podMonitor": {"namespace": "monitoring"}},
        {"imagePullSecrets": [{"name": "regcred"}], "podLabels": {"example.com/team": "gpu_a-1"}},
    ],
)
def test_values_schema_takes_what_the_api_server_takes(values: dict[str, Any]) -> None:
    chart.template(values)


@pytest.mark.parametrize("value", ["memory", "unlimited", "disabled", "4", 4])
def test_consumable_shares_reaches_the_kubelet_plugin_as_nvidias_flag(value: str | int) -> None:
    container = _container(chart.template({"kubeletPlugin": {"consumableShares": value}}))
    # The variable sets the flag of that name (test_every_driver_env_var_is_a_kubelet_plugin_flag).
    assert _env(container)["DRA_GPU_CONSUMABLE_SHARES"] == str(value)


def test_the_unhealthy_taint_effect_reaches_the_kubelet_plugin() -> None:
    container = _container(chart.template({"unhealthyTaintEffect": "NoExecute"}))
    assert _env(container)["DRA_GPU_UNHEALTHY_TAINT_EFFECT"] == "NoExecute"


def test_the_claim_metrics_interval_reaches_the_kubelet_plugin() -> None:
    assert _env(_container(chart.template()))["DRA_GPU_CLAIM_METRICS_INTERVAL"] == "10"
    container = _container(chart.template({"kubeletPlugin": {"claimMetricsInterval": 2.5}}))
    assert _env(container)["DRA_GPU_CLAIM_METRICS_INTERVAL"] == "2.5"


def test_the_grafana_dashboard_is_a_configmap_for_the_sidecar_only_when_asked() -> None:
    assert not [o for o in chart.template() if o["kind"] == "ConfigMap"]
    [configmap] = [
        o
        for o in chart.template({"grafanaDashboard": {"enabled": True}}, namespace="gpus")
        if o["kind"] == "ConfigMap"
    ]
    assert configmap["metadata"]["namespace"] == "gpus"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in configmap["metadata"]
    assert json.loads(configmap["data"]["dra-gpu.json"]) == grafana.load()
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "labels": {"grafana_dashboard": "dra"},
            "annotations": {"grafana_folder": "GPUs"},
        }
    }
    [moved] = [o for o in chart.template(values) if o["kind"] == "ConfigMap"]
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["grafana_dashboard"] == "dra"
    assert moved["metadata"]["annotations"] == {"grafana_folder": "GPUs"}


def test_committed_manifests_equal_a_fresh_render() -> None:
    """deploy/manifests must be re-rendered (make manifests) whenever the chart changes."""
    fresh = chart.render_manifests()
    committed = {p.name: p.read_text() for p in chart.MANIFESTS.glob("*.yaml")}
    assert sorted(committed) == sorted(fresh), "run `make manifests`"
    stale = [name for name in fresh if committed[name] != fresh[name]]
    assert not stale, f"deploy/manifests/{stale[0]} differs from the chart's render: run `make manifests`"


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((chart.MANIFESTS / "kustomization.yaml").read_text())
    files = sorted(p.name for p in chart.MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    kinds = [
        doc["kind"] for name in files for doc in yaml.safe_load_all((chart.MANIFESTS / name).read_text())
    ]
    assert "Namespace" in kinds
    assert "ConfigMap" not in kinds, "the plain manifests are for real GPUs"


def test_explain_offline_uses_the_classes_the_chart_installs() -> None:
    """dra-gpu explain --fake-gpus falls back to standard_device_classes: they must be the chart's."""

    def essence(device_class: Obj) -> tuple[str, list[str]]:
        return device_class["metadata"]["name"], [
            s["cel"]["expression"] for s in device_class["spec"]["selectors"]
        ]

    rendered = sorted(essence(o) for o in chart.template() if o["kind"] == "DeviceClass")
    assert rendered == sorted(essence(c) for c in standard_device_classes("gpu.nvidia.com"))


TIME_SLICING = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
ALONE: dict[str, Any] = {"kubeletPlugin": {"enabled": False}}


def _device_plugin_pod(config: dict[str, Any], **more: Any) -> tuple[Obj, list[Obj]]:
    objects = chart.template({**ALONE, "devicePlugin": {"enabled": True, "config": config, **more}})
    return _only(objects, "DaemonSet")["spec"]["template"]["spec"], objects


def test_device_plugin_config_data_becomes_a_configmap_mounted_as_the_file() -> None:
    pod, objects = _device_plugin_pod({"data": TIME_SLICING}, migStrategy="single", deviceListStrategy="")
    [container] = pod["containers"]
    env = _env(container)
    assert env["DRA_GPU_CONFIG_FILE"] == "/etc/dra-gpu/device-plugin/config.yaml"
    assert env["DRA_GPU_MIG_STRATEGY"] == "single"
    assert "DRA_GPU_DEVICE_LIST_STRATEGY" not in env, "empty: the file chooses"
    configmap = _only(objects, "ConfigMap")
    assert configmap["data"] == {"config.yaml": TIME_SLICING}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["device-plugin-config"]["configMap"] == {
        "name": configmap["metadata"]["name"],
        "items": [{"key": "config.yaml", "path": "config.yaml"}],
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["device-plugin-config"] == {
        "name": "device-plugin-config",
        "mountPath": "/etc/dra-gpu/device-plugin",
        "readOnly": True,
    }


def test_device_plugin_config_can_be_an_existing_configmap_and_is_absent_by_default() -> None:
    pod, objects = _device_plugin_pod({"name": "time-slicing-config", "key": "any"})
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["device-plugin-config"]["configMap"] == {
        "name": "time-slicing-config",
        "items": [{"key": "any", "path": "config.yaml"}],
    }
    default, _ = _device_plugin_pod({})
    assert "device-plugin-config" not in {v["name"] for v in default["volumes"]}
    assert not {"DRA_GPU_CONFIG_FILE", "DRA_GPU_MIG_STRATEGY"} & set(_env(default["containers"][0]))
    with chart.values_flags(
        {
            **ALONE,
            "devicePlugin": {
                "enabled": True,
                "config": {"data": "version: v1", "name": "time-slicing-config"},
            },
        }
    ) as flags:
        result = chart.helm("template", "dra-gpu", str(chart.CHART), *flags, check=False)
    assert result.returncode != 0
    assert "devicePlugin.config: set data" in result.stderr


LABELLER: dict[str, Any] = {
    "nodeLabeller": {
        "enabled": True,
        "adminLabels": {"gpu-type": "{model}", "example.com/mem": "{memoryGiB}gb"},
    }
}


def _labeller_container(objects: list[Obj]) -> Obj:
    containers: list[Obj] = _only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    [labeller] = [c for c in containers if c["name"] == "node-labeller"]
    return labeller


def test_node_labeller_is_off_by_default_and_a_third_container_when_on() -> None:
    assert _container(chart.template())["name"] == "kubelet-plugin"
    objects = chart.template({**LABELLER, **FAKE})
    labeller = _labeller_container(objects)
    assert labeller["command"] == ["dra-gpu", "node-labeller"]
    assert labeller["args"] == ["--fake-gpus=/etc/dra-gpu/fake-gpus/profiles.yaml"]
    env = _env(labeller)
    assert {name for name in env if name.startswith("DRA_GPU_")} <= _flags("node-labeller")
    assert env["DRA_GPU_LABEL_TEMPLATE"] == "example.com/mem={memoryGiB}gb,gpu-type={model}"
    assert env["DRA_GPU_HTTP_ADDRESS"] == ":8082"
    assert "DRA_GPU_MIG_STRATEGY" not in env  # no device plugin: GFD's default, none
    # It writes nothing on the host: no CDI directory, no plugin directory.
    assert {m["name"] for m in labeller["volumeMounts"]} == {"tmp", "fake-gpus"}


def test_node_labeller_follows_the_device_plugins_settings() -> None:
    values = {
        **SPLIT,
        **LABELLER,
        "devicePlugin": {"enabled": True, "migStrategy": "single", "config": {"data": "version: v1\n"}},
    }
    env = _env(_labeller_container(chart.template(values)))
    assert env["DRA_GPU_MIG_STRATEGY"] == "single"
    assert env["DRA_GPU_CONFIG_FILE"] == "/etc/dra-gpu/device-plugin/config.yaml"


def test_node_labeller_labels_the_device_plugins_default_strategy_when_nothing_sets_one() -> None:
    # The device plugin runs mixed by default (--mig-strategy); GFD's labels must say what it serves.
    env = _env(_labeller_container(chart.template({**SPLIT, **LABELLER, **FAKE})))
    assert env["DRA_GPU_MIG_STRATEGY"] == "mixed"
    with_file = {**SPLIT, **LABELLER, "devicePlugin": {"enabled": True, "config": {"data": "version: v1\n"}}}
    assert "DRA_GPU_MIG_STRATEGY" not in _env(_labeller_container(chart.template(with_file))), "the file's"


def test_node_labeller_may_patch_nodes_only_under_its_policy() -> None:
    objects = chart.template(LABELLER, release="gpu", namespace="kube-gpu")
    role = _only(objects, "ClusterRole")
    [nodes] = [r for r in role["rules"] if r["resources"] == ["nodes"]]
    assert nodes["verbs"] == ["get", "patch"]
    [policy] = [
        o
        for o in objects
        if o["metadata"]["name"].endswith("own-node-labels") and o["kind"] == "ValidatingAdmissionPolicy"
    ]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["adminKeys"] == '["example.com/mem","gpu-type"]'
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"]
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {b["spec"]["policyName"] for b in bindings} == {
        "gpu-dra-gpu-own-node-slices",
        "gpu-dra-gpu-own-claim-status",
        "gpu-dra-gpu-own-node-labels",
    }
    without = chart.template({**LABELLER, "admissionPolicy": {"enabled": False}})
    assert not [o for o in without if o["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(
    ("labels", "complaint"),
    [
        ({"nvidia.com/x": "{model}"}, "invalid propertyName 'nvidia.com/x'"),
        ({"a": "{model},b"}, "/nodeLabeller/adminLabels/a"),
    ],
)
def test_values_schema_rejects_bad_admin_labels(labels: dict[str, str], complaint: str) -> None:
    with chart.values_flags({"nodeLabeller": {"enabled": True, "adminLabels": labels}}) as flags:
        result = chart.helm("template", "dra-gpu", str(chart.CHART), *flags, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_named_device_plugin_configs_mount_a_configmap_directory_and_grant_node_watch() -> None:
    pod, objects = _device_plugin_pod({}, namedConfigs={"configMap": "dp-configs", "default": "one"})
    [container] = pod["containers"]
    env = _env(container)
    assert env["DRA_GPU_CONFIG_DIR"] == "/etc/dra-gpu/device-plugin-configs"
    assert env["DRA_GPU_CONFIG_DEFAULT"] == "one"
    assert "DRA_GPU_CONFIG_FILE" not in env
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["device-plugin-configs"]["configMap"] == {"name": "dp-configs"}, "every key, no subPath"
    rules = {tuple(r["resources"]): r["verbs"] for r in _only(objects, "ClusterRole")["rules"]}
    assert rules[("nodes",)] == ["get", "watch"]
    assert rules[("events",)] == ["create"]
    with chart.values_flags(
        {
            **ALONE,
            "devicePlugin": {
                "enabled": True,
                "config": {"data": "version: v1"},
                "namedConfigs": {"configMap": "dp-configs"},
            },
        }
    ) as flags:
        result = chart.helm("template", "dra-gpu", str(chart.CHART), *flags, check=False)
    assert result.returncode != 0
    assert "set config (one file) or namedConfigs" in result.stderr


def test_dynamic_mig_is_turned_on_per_node_through_the_mig_mode_variable() -> None:
    objects = chart.template(FAKE, extra=["--set", "mig.nodes.gpu-node-3=dynamic"])
    env = _env(_container(objects))
    assert env["DRA_GPU_MIG_MODE"] == "static,@gpu-node-3=dynamic"
    modes = build_parser().parse_args(["discover", f"--mig-mode={env['DRA_GPU_MIG_MODE']}"]).mig_mode
    assert modes.for_node("gpu-node-3").default == "dynamic"
    assert modes.for_node("gpu-node-1").default == "static"
    assert "DRA_GPU_MIG_MODE" not in _env(_container(chart.template(FAKE)))


def test_rolling_updates_overlap_old_and_new_pod_on_their_own_sockets() -> None:
    objects = chart.template()
    daemonset = _only(objects, "DaemonSet")
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    env = _env(_container(objects))
    assert env["DRA_GPU_ROLLING_UPDATE"] == "true"
    assert env["DRA_GPU_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # Two pods on one node: nothing of the host's network may be claimed by either.
    pod = daemonset["spec"]["template"]["spec"]
    assert not pod.get("hostNetwork")
    assert not [p for c in pod["containers"] for p in c.get("ports", []) if "hostPort" in p]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"kubeletPlugin": {"rollingUpdate": False}}, id="off"),
        pytest.param(
            {"devicePlugin": {"enabled": True}, "gpuAssignment": {"devicePlugin": "3"}}, id="device-plugin"
        ),
    ],
)
def test_without_rolling_updates_pods_are_replaced_one_after_the_other(values: dict[str, Any]) -> None:
    objects = chart.template(values)
    daemonset = _only(objects, "DaemonSet")
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    [plugin] = [
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "kubelet-plugin"
    ]
    env = _env(plugin)
    assert env["DRA_GPU_ROLLING_UPDATE"] == "false"
    assert "DRA_GPU_INSTANCE_ID" not in env


def test_static_mig_layouts_become_a_configmap_the_kubelet_plugin_applies(tmp_path: Path) -> None:
    layouts = {"all-1g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}
    objects = chart.template({**FAKE, "mig": {"configs": layouts, "config": "all-1g"}})
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = _container(objects)
    env = _env(container)
    assert env["DRA_GPU_MIG_CONFIG_FILE"] == "/etc/dra-gpu/mig/config.yaml"
    assert env["DRA_GPU_MIG_CONFIG"] == "all-1g"
    configmap = next(
        o for o in objects if o["kind"] == "ConfigMap" and "mig-configs" in o["metadata"]["name"]
    )
    assert {v["name"]: v for v in pod["volumes"]}["mig-configs"]["configMap"] == {
        "name": configmap["metadata"]["name"]
    }
    assert {m["name"]: m for m in container["volumeMounts"]}["mig-configs"]["mountPath"] == "/etc/dra-gpu/mig"
    # The file is what the driver reads.
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    assert load_configs(path).layout("all-1g")[0].mig_devices == (("1g.10gb", 7),)
    assert "DRA_GPU_MIG_CONFIG_FILE" not in _env(_container(chart.template(FAKE)))


def test_mig_layouts_may_watch_their_node_and_set_only_its_state_label() -> None:
    layouts = {"all-1g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}
    objects = chart.template({**FAKE, "mig": {"configs": layouts}}, release="gpu", namespace="kube-gpu")
    [nodes] = [r for r in _only(objects, "ClusterRole")["rules"] if r["resources"] == ["nodes"]]
    # watch: the plugin follows its Node's nvidia.com/mig.config label.
    assert nodes["verbs"] == ["get", "watch", "patch"]
    [events] = [r for r in _only(objects, "ClusterRole")["rules"] if r["resources"] == ["events"]]
    assert events["verbs"] == ["create"], "MigLayoutIncomplete and MigLayoutFailed on the Node"
    [policy] = [
        o
        for o in objects
        if o["metadata"]["name"].endswith("own-node-labels") and o["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["adminKeys"] == "[]"
    labels = next(v for v in policy["spec"]["validations"] if "newLabels.all" in v["expression"])
    assert "k == 'nvidia.com/mig.config.state'" in labels["expression"]
    assert "startsWith" not in labels["expression"]
    assert labels["message"].endswith("may change only the label nvidia.com/mig.config.state")
    # Layouts without the kubelet plugin apply nowhere: nothing granted for them.
    unused = chart.template(
        {
            **FAKE,
            "mig": {"configs": layouts},
            "kubeletPlugin": {"enabled": False},
            "devicePlugin": {"enabled": True},
        }
    )
    [nodes] = [r for r in _only(unused, "ClusterRole")["rules"] if r["resources"] == ["nodes"]]
    assert nodes["verbs"] == ["get"]
    # Neither layouts nor the labeller: no patch, no policy on Nodes.
    plain = chart.template(FAKE)
    [nodes] = [r for r in _only(plain, "ClusterRole")["rules"] if r["resources"] == ["nodes"]]
    assert nodes["verbs"] == ["get"]
    assert not [o for o in plain if o["metadata"]["name"].endswith("own-node-labels")]


def test_the_mig_profiles_offered_are_set_per_node_through_the_mig_profiles_variable() -> None:
    objects = chart.template(
        {
            **FAKE,
            "mig": {
                "profiles": "common,4g.40gb",
                "profileNodes": {"n3": "all", "n4": ["2g.20gb", "1g.10gb"]},
            },
        }
    )
    env = _env(_container(objects))
    assert env["DRA_GPU_MIG_PROFILES"] == "common,4g.40gb,@n3=all,@n4=2g.20gb,@n4=1g.10gb"
    offer = (
        build_parser().parse_args(["discover", f"--mig-profiles={env['DRA_GPU_MIG_PROFILES']}"]).mig_profiles
    )
    assert offer.for_node("n3").items == {"all"}
    assert offer.for_node("n4").items == {"2g.20gb", "1g.10gb"}
    assert offer.for_node("n1").items == {"common", "4g.40gb"}
    assert "DRA_GPU_MIG_PROFILES" not in _env(_container(chart.template(FAKE)))


def test_the_plugin_mounts_only_the_driver_directories_it_reads() -> None:
    # Each mount is a directory of driverfiles' lookups, and every lookup is inside one: the
    # driver root itself (on a host install, the host's / with the kubelet's key) is never mounted.
    pod = _only(chart.template(), "DaemonSet")["spec"]["template"]["spec"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if v["name"].startswith("driver-")}
    assert host_paths == {f"/{d}" for d in (*driverfiles.FILE_DIRS, *driverfiles.IPC_DIRS)}
    assert "/" not in {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    looked_up = [
        *driverfiles.LIBRARY_DIRS,
        *driverfiles.BINARY_DIRS,
        *driverfiles.FIRMWARE_DIRS,
        *driverfiles.IPC_PATHS,
    ]
    # Only a root of the driver's own has lib64 and firmware/nvidia, and such a root is mounted whole.
    looked_up = [p for p in looked_up if p not in driverfiles.CONTAINER_DIRS]
    mounted = (*driverfiles.FILE_DIRS, *driverfiles.IPC_DIRS)
    assert all(any(f"{p}/".startswith(f"{d}/") for d in mounted) for p in looked_up)


@pytest.mark.parametrize("root", ["/usr/local/nvidia", "/run/nvidia/driver/", "/run//nvidia/driver"])
def test_a_driver_root_of_its_own_is_mounted_whole_and_read_only(root: str) -> None:
    pod = _only(chart.template({"driverFiles": {"root": root}}), "DaemonSet")["spec"]["template"]["spec"]
    volumes = [v for v in pod["volumes"] if v["name"].startswith("driver-")]
    clean = os.path.normpath(root)
    assert volumes == [{"name": "driver-root", "hostPath": {"path": clean, "type": "Directory"}}]
    plugin = next(c for c in pod["containers"] if c["name"] == "kubelet-plugin")
    mounts = [m for m in plugin["volumeMounts"] if m["name"].startswith("driver-")]
    expected = {"name": "driver-root", "mountPath": f"/host{clean}", "readOnly": True}
    assert mounts == [expected | {"mountPropagation": "HostToContainer"}]


@pytest.mark.parametrize("root", ["/", "//", "/./"])
def test_the_hosts_root_however_spelt_is_never_mounted_whole(root: str) -> None:
    pod = _only(chart.template({"driverFiles": {"root": root}}), "DaemonSet")["spec"]["template"]["spec"]
    assert "/" not in {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {v["name"] for v in pod["volumes"]} >= {"driver-usr", "driver-lib", "driver-bin", "driver-sbin"}


def test_the_slice_policy_pins_the_driver_and_the_nodes_pool() -> None:
    [policy] = [
        o
        for o in chart.template({"driverName": "gpu.example.com"})
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("own-node-slices")
    ]
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    assert 'variables.slice.spec.driver == "gpu.example.com"' in expressions
    assert "variables.requesterNode == '' || variables.slicePool == variables.requesterNode" in expressions


def test_the_labeller_may_change_only_the_keys_it_writes() -> None:
    [policy] = [
        o
        for o in chart.template(LABELLER)
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("own-node-labels")
    ]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert set(json.loads(variables["gfdKeys"])) == labels.STATIC_KEYS
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert f"k.matches(r'{labels.MIG_KEY.pattern}')" in text
    assert "startsWith('nvidia.com/')" not in text


def test_per_process_usage_is_off_by_default_and_brings_host_pids_and_pod_listing_when_on() -> None:
    objects = chart.template()
    pod = _only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert "hostPID" not in pod
    assert _env(_container(objects))["DRA_GPU_USAGE_PROCESSES"] == "false"
    assert _env(_container(objects))["DRA_GPU_USAGE_MAX_SERIES"] == "2000"
    on = chart.template({"usage": {"processes": True, "maxSeries": 50}})
    assert _only(on, "DaemonSet")["spec"]["template"]["spec"]["hostPID"] is True
    assert _env(_container(on))["DRA_GPU_USAGE_PROCESSES"] == "true"
    assert _env(_container(on))["DRA_GPU_USAGE_MAX_SERIES"] == "50"
    rules = _only(on, "ClusterRole")["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]} in rules
    assert len(rules) == len(_only(objects, "ClusterRole")["rules"]) + 1


def test_the_pod_monitor_is_off_by_default_and_scrapes_every_metrics_port_with_the_drivers_labels() -> None:
    assert not [o for o in chart.template() if o["kind"] == "PodMonitor"]
    values = {
        **SPLIT,
        **LABELLER,
        "webhook": {"enabled": True},
        "podMonitor": {"enabled": True, "interval": "30s"},
    }
    objects = chart.template(values, release="gpu", namespace="kube-gpu")
    monitor = _only(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "kube-gpu"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["kube-gpu"]}
    # Every pod of the release: the DaemonSet's and the webhook's carry these labels.
    pods = [o["spec"]["template"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")]
    assert len(pods) == 2
    for pod in pods:
        assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for pod in pods for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    endpoints = spec["podMetricsEndpoints"]
    assert {e["port"] for e in endpoints} == {p for p in ports if p.startswith("http") and p != "https"}
    # The claim series carry the GPU user's pod, namespace and container: the scrape keeps them.
    assert all(e["honorLabels"] and e["path"] == "/metrics" and e["interval"] == "30s" for e in endpoints)
