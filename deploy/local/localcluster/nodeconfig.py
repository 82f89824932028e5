"""What a local cluster's node components are configured with: the kubelet's and kube-proxy's files.

Plain data for localcluster.cluster, which writes them and starts the components.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localcluster import nodenet

#: kube-proxy's default health port, on the node's address (its namespace is the cluster's own).
KUBE_PROXY_HEALTHZ_PORT = 10256


def kubelet_configuration(
    run: Path,
    node_ip: str,
    ports: Mapping[str, int],
    creds: Mapping[str, str],
    runtime_sock: Path,
    gates: Mapping[str, bool],
) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration: serving on the node's address, on the runtime's socket."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": node_ip,
        "healthzPort": ports["healthz"],
        "tlsCertFile": creds["kubelet_serving_cert"],
        "tlsPrivateKeyFile": creds["kubelet_serving_key"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": creds["ca"]},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{runtime_sock}",
        "imageServiceEndpoint": f"unix://{runtime_sock}",
        "featureGates": dict(gates),
        # This machine has cgroup v1 and no systemd: the kubelet must not manage cgroups.
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "cgroupDriver": "cgroupfs",
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        "volumePluginDir": str(run / "kubelet" / "volume-plugins"),
        "resolvConf": "",
        "clusterDNS": ["10.0.0.10"],
        "clusterDomain": "cluster.local",
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "2s",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_configuration(
    run: Path, net: nodenet.NodeNetwork, node_name: str, gates: Mapping[str, bool]
) -> dict[str, Any]:
    """kube-proxy's KubeProxyConfiguration: nftables mode in the node's network namespace."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(run / "kube-proxy.kubeconfig")},
        "mode": "nftables",
        "clusterCIDR": net.pod_subnet,
        "hostnameOverride": node_name,
        "healthzBindAddress": f"{net.node_ip}:{KUBE_PROXY_HEALTHZ_PORT}",
        # Zero leaves the conntrack table's size and timeouts as they are: the machine's
        # settings, which a node's namespace cannot (and must not) change.
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "featureGates": dict(gates),
    }
