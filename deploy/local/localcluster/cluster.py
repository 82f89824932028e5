"""A one-node Kubernetes cluster of real binaries on 127.0.0.1.

etcd, kube-apiserver (TLS, service-account tokens, Node+RBAC authorization,
NodeRestriction), kube-controller-manager (resourceclaim controller and the
rest of the defaults, minus node lifecycle and taint eviction), kube-scheduler,
and one real kubelet on a fake CRI runtime (or, with CONTAINER_RUNTIME=containerd,
on containerd and runc: localcluster.containerd). The kubelet runs in a private mount
namespace with tmpfs over /var/lib and /var/log, so its mounts and hard-coded
paths never touch the host; its device-plugin directory (hard-coded to
/var/lib/kubelet/device-plugins) is a bind of a directory of the run, so device
plugins outside the namespace can reach kubelet.sock.

Everything of one run lives in one directory, and cluster.json there names each
process as soon as it starts, so stop_run_dir() (`make cluster-down`) can end a
cluster whose owner died; stop() ends every process and removes that directory.
stop_on_signals() turns SIGINT, SIGTERM and SIGHUP into an exception, so the
`finally` of whoever started a cluster stops it: its processes run in process
groups of their own and would not get a terminal's signals. restart_kubelet()
stops only the kubelet and starts it again as before (same flags, a fresh mount
namespace set up the same way), as a node's kubelet restarts: device plugins
must then register again.

The Kubernetes release is KUBERNETES_VERSION's (binaries.kubernetes_version()),
and RELEASES says what each minor needs turned on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from fakenvml.fakecuda import install_driver_libraries

from dra.adapters.atomicfile import write_atomic
from dra.fakegpus import node as fakegpus
from localcluster import containerd, images, nodenet, pki
from localcluster.binaries import ensure_cluster_binaries, ensure_containerd_binaries, kubernetes_version

NODE_NAME = "gpu-node-1"


@dataclass(frozen=True)
class Release:
    """What one Kubernetes minor needs turned on for the driver's features."""

    #: Gates beyond the release's defaults; every component gets them (they share one registry).
    feature_gates: Mapping[str, bool]
    #: API versions beyond the default ones that those gates need served (--runtime-config).
    runtime_config: tuple[str, ...]


#: The driver's features: DRAPartitionableDevices, DRADeviceTaints, DRAConsumableCapacity,
#: DRAExtendedResource, ResourceHealthStatus; each needs DynamicResourceAllocation, GA and on since 1.34.
RELEASES: dict[str, Release] = {
    # All five are alpha in 1.34, off by default.
    "1.34": Release(
        feature_gates={
            "DRAPartitionableDevices": True,
            "DRADeviceTaints": True,
            "DRAExtendedResource": True,
            "DRAConsumableCapacity": True,
            "ResourceHealthStatus": True,
        },
        # DeviceTaintRule (DRADeviceTaints) is served only as v1alpha3, and the scheduler waits
        # for it; v1beta1 and v1beta2 serve clients of the older resource APIs.
        runtime_config=("resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1alpha3"),
    ),
    # All five are on by default in 1.37. The beta ones are set anyway, so that the harness
    # says what it relies on; DRADeviceTaints is GA (setting it only warns) and
    # DRAExtendedResource GA and locked (setting it false fails), so they are left alone.
    "1.37": Release(
        feature_gates={
            "DRAPartitionableDevices": True,
            "DRAConsumableCapacity": True,
            "ResourceHealthStatus": True,
        },
        # DeviceTaintRule is in resource.k8s.io/v1 (DRADeviceTaintRules is GA): nothing to add.
        runtime_config=(),
    ),
}


def release(version: str) -> Release:
    """The entry of RELEASES for a version such as v1.37.2."""
    minor = ".".join(version.lstrip("v").split(".")[:2])
    try:
        return RELEASES[minor]
    except KeyError:
        raise ClusterError(
            f"Kubernetes {version}: the harness knows the feature gates of {', '.join(RELEASES)} only "
            "(add the minor to localcluster.cluster.RELEASES)"
        ) from None


def default_feature_gates(version: str | None = None) -> dict[str, bool]:
    """The gates a cluster of this release (default: the chosen one) starts with."""
    return dict(release(version or kubernetes_version()).feature_gates)


_STOP_ORDER = (
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
    "fakeruntime",
)


#: kube-proxy's default health port, on the node's address (its namespace is the cluster's own).
KUBE_PROXY_HEALTHZ_PORT = 10256


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the component and its log."""


#: The container runtimes a cluster can run on; the first is the default.
RUNTIMES = ("fake", "containerd")


def container_runtime() -> str:
    """The runtime to run: $CONTAINER_RUNTIME (fake or containerd), else the fast fake one."""
    wanted = os.environ.get("CONTAINER_RUNTIME", "").strip() or RUNTIMES[0]
    if wanted not in RUNTIMES:
        raise ClusterError(f"CONTAINER_RUNTIME={wanted}: expected one of {', '.join(RUNTIMES)}")
    return wanted


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _runtime_config_flag(versions: tuple[str, ...]) -> list[str]:
    return [f"--runtime-config={','.join(f'{version}=true' for version in versions)}"] if versions else []


def _gates_flag(gates: Mapping[str, bool]) -> str:
    return ",".join(f"{name}={str(value).lower()}" for name, value in sorted(gates.items()))


def parse_gates(text: str, version: str | None = None) -> dict[str, bool]:
    """Parse "A=true,B=false" into a dict, starting from the harness defaults of the release."""
    gates = default_feature_gates(version)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {item!r}: expected Name=true or Name=false")
        gates[name] = value.lower() == "true"
    return gates


@dataclass
class ClusterInfo:
    """What a user of the cluster needs: paths, the node name, process IDs."""

    run_dir: str
    kubeconfig: str
    kubelet_root: str
    device_plugin_dir: str
    cdi_dir: str
    runtime_records: str
    node_name: str
    api_server: str
    feature_gates: dict[str, bool]
    pids: dict[str, int] = field(default_factory=dict)
    #: The Kubernetes release the cluster runs, e.g. v1.37.2.
    kubernetes_version: str = ""
    #: "fake" (records what it resolved in runtime_records) or "containerd" (real containers).
    container_runtime: str = "fake"
    #: On containerd: where the driver makes the fake GPUs' device nodes and driver (--fake-gpu-root).
    fake_gpu_root: str = ""
    #: On containerd: the image test pods run (a static busybox) and the sandbox image.
    test_image: str = ""
    pause_image: str = "registry.k8s.io/pause:3.10"
    #: The node's InternalIP: its own network namespace's address on containerd (localcluster.nodenet).
    node_ip: str = "127.0.0.1"
    #: On containerd: the pods' addresses.
    pod_subnet: str = ""

    @property
    def plugins_registry(self) -> str:
        """Where DRA drivers place their registration socket."""
        return os.path.join(self.kubelet_root, "plugins_registry")

    @property
    def plugins_dir(self) -> str:
        """Where DRA drivers place their service socket (plugins/<driver>/dra.sock)."""
        return os.path.join(self.kubelet_root, "plugins")

    def log_path(self, component: str) -> str:
        """The log file of one component."""
        return os.path.join(self.run_dir, "logs", f"{component}.log")

    def save(self) -> None:
        """Write cluster.json into the run directory, for `down` and for tools."""
        write_atomic(Path(self.run_dir) / "cluster.json", json.dumps(asdict(self), indent=2).encode())

    @classmethod
    def load(cls, run_dir: str | Path) -> ClusterInfo:
        """Read the cluster.json a running cluster wrote."""
        data = json.loads((Path(run_dir) / "cluster.json").read_text())
        return cls(**data)


class LocalCluster:
    """Start with start(), end with stop(); or use as a context manager."""

    def __init__(
        self,
        run_dir: Path | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        node_name: str = NODE_NAME,
        version: str | None = None,
        kubelet: bool = True,
        runtime: str | None = None,
        controller_manager_args: Sequence[str] = (),
        kubelet_config: Mapping[str, object] | None = None,
        scheduler_args: Sequence[str] = (),
    ) -> None:
        """`kubelet=False` starts the control plane only (benchmarks with Node objects but no kubelets).

        `controller_manager_args` and `scheduler_args` go after those components' own flags, and
        `kubelet_config` over the kubelet's KubeletConfiguration (a benchmark that raises their API
        rate limits to show those limits' share).
        """
        self.version = version or kubernetes_version()
        self.runtime = runtime or container_runtime()
        if self.runtime not in RUNTIMES:
            raise ClusterError(f"container runtime {self.runtime!r}: expected one of {', '.join(RUNTIMES)}")
        release(self.version)  # an unknown minor fails here, before anything starts
        # Unix socket paths are capped at 107 bytes: keep the run directory short.
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="dra-gpu-", dir="/tmp"))
        self.gates = default_feature_gates(self.version) if feature_gates is None else dict(feature_gates)
        self.node_name = node_name
        self.kubelet = kubelet
        self.controller_manager_args = tuple(controller_manager_args)
        self.kubelet_config = dict(kubelet_config or {})
        self.scheduler_args = tuple(scheduler_args)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._kubelet_command: list[str] = []
        self._kubelet_healthz = ""
        #: Shell steps run in the kubelet's namespace before it starts (containerd's start).
        self._runtime_setup: list[str] = []
        #: On containerd: the node's network namespace and its link to the machine.
        self.net: nodenet.NodeNetwork | None = None
        self.info: ClusterInfo | None = None

    def __enter__(self) -> ClusterInfo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start -------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> ClusterInfo:
        """Bring every component up and wait until the node is Ready and schedulable."""
        if os.geteuid() != 0:
            raise ClusterError(
                "the kubelet runs in a mount namespace of its own: run as root (or with CAP_SYS_ADMIN)"
            )
        if shutil.which("unshare") is None:
            raise ClusterError("unshare (util-linux) is needed to run the kubelet in its own mount namespace")
        bins = ensure_cluster_binaries(self.version)
        real = self.runtime == "containerd"
        ctr_bins = ensure_containerd_binaries() if real else bins
        sandbox, test_image = (images.pause_image(), images.busybox_image()) if real else (None, None)
        deadline = time.monotonic() + timeout
        run = self.run_dir
        for sub in ("logs", "pki", "etcd", "kubelet", "kubelet-work", "device-plugins", "cdi", "records"):
            (run / sub).mkdir(parents=True, exist_ok=True)
        ports = {name: _free_port() for name in ("etcd", "etcd-peer", "apiserver", "kubelet", "healthz")}
        # On containerd the node is a network namespace of its own, and the control plane listens
        # on the machine's end of its link, where pods reach it through the kubernetes Service.
        self.net = None
        if real:
            try:
                self.net = nodenet.create(run)
            except nodenet.NodeNetworkError as err:
                raise ClusterError(str(err)) from None
        control_plane = self.net.host_ip if self.net else "127.0.0.1"
        api = f"https://{control_plane}:{ports['apiserver']}"
        self.info = info = ClusterInfo(
            run_dir=str(run),
            kubeconfig=str(run / "admin.kubeconfig"),
            kubelet_root=str(run / "kubelet"),
            device_plugin_dir=str(run / "device-plugins"),
            cdi_dir=str(run / "cdi"),
            runtime_records=str(run / "records"),
            node_name=self.node_name,
            api_server=api,
            feature_gates=self.gates,
            kubernetes_version=self.version,
            container_runtime=self.runtime,
        )
        if sandbox is not None and test_image is not None:
            info.fake_gpu_root = str(run / "fakegpus")
            # The fake driver's libraries are ELF objects a container's loader and ldconfig take.
            install_driver_libraries(run / "fakegpus" / fakegpus.LIBRARIES)
            info.test_image, info.pause_image = test_image.name, sandbox.name
        if self.net is not None:
            info.node_ip, info.pod_subnet = self.net.node_ip, self.net.pod_subnet
        try:
            creds = self._write_pki_and_kubeconfigs(api)
            runtime_sock = run / "runtime.sock"
            self._runtime_setup = []
            if sandbox is not None and test_image is not None and self.net is not None:
                containerd.write_config(run, ctr_bins, info.cdi_dir, sandbox, self.net)
                runtime_sock = containerd.layout(run)["socket"]
                self._runtime_setup = containerd.start_commands(ctr_bins, run, [sandbox, test_image])
            else:
                self._spawn(
                    "fakeruntime",
                    [
                        str(bins / "fakeruntime"),
                        f"--listen={runtime_sock}",
                        f"--cdi-dirs={info.cdi_dir}",
                        f"--record-dir={info.runtime_records}",
                    ],
                )
            self._spawn(
                "etcd",
                [
                    str(bins / "etcd"),
                    f"--data-dir={run / 'etcd'}",
                    f"--listen-client-url=http://127.0.0.1:{ports['etcd']}",
                    f"--listen-peer-url=http://127.0.0.1:{ports['etcd-peer']}",
                ],
            )
            self._spawn("kube-apiserver", self._apiserver_args(bins, ports, creds))
            self._wait_api(api, creds, deadline)
            gates = _gates_flag(self.gates)
            self._spawn(
                "kube-controller-manager",
                [
                    str(bins / "kube-controller-manager"),
                    f"--kubeconfig={run / 'controller-manager.kubeconfig'}",
                    "--secure-port=0",
                    "--leader-elect=false",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={creds['sa_key']}",
                    f"--root-ca-file={creds['ca']}",
                    f"--cluster-signing-cert-file={creds['ca']}",
                    f"--cluster-signing-key-file={creds['ca_key']}",
                    "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller",
                    f"--feature-gates={gates}",
                    "--v=1",
                    *self.controller_manager_args,
                ],
            )
            self._spawn(
                "kube-scheduler",
                [
                    str(bins / "kube-scheduler"),
                    f"--kubeconfig={run / 'scheduler.kubeconfig'}",
                    "--secure-port=0",
                    "--leader-elect=false",
                    f"--feature-gates={gates}",
                    "--v=2",
                    *self.scheduler_args,
                ],
            )
            if self.kubelet:
                self._start_kubelet(bins, ports, creds, runtime_sock)
                if self.net is not None:
                    self._start_kube_proxy(bins, self.net, deadline)
            self._wait_node_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return info

    def _write_pki_and_kubeconfigs(self, api: str) -> dict[str, str]:
        run = self.run_dir
        ca = pki.CertificateAuthority(run / "pki")
        control_plane, node = (self.net.host_ip, self.net.node_ip) if self.net else ("127.0.0.1", "127.0.0.1")
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            hosts=(
                control_plane,
                "127.0.0.1",
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server=True,
        )
        kubelet_serving = ca.issue("kubelet-serving", self.node_name, hosts=(node,), server=True)
        apiserver_kubelet = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        sa_key, sa_pub = pki.service_account_key(run / "pki")
        clients = {
            "admin": ca.issue("admin", "kubernetes-admin", ("system:masters",)),
            "controller-manager": ca.issue("controller-manager", "system:kube-controller-manager"),
            "scheduler": ca.issue("scheduler", "system:kube-scheduler"),
            "kubelet": ca.issue("kubelet", f"system:node:{self.node_name}", ("system:nodes",)),
            # The user the default ClusterRoleBinding system:node-proxier binds.
            "kube-proxy": ca.issue("kube-proxy", "system:kube-proxy"),
        }
        for name, pair in clients.items():
            _write_kubeconfig(run / f"{name}.kubeconfig", api, ca.cert_path, pair)
        ca_key = run / "pki" / "ca.key"
        pki.write_private_key(ca.key, ca_key)
        return {
            "ca": str(ca.cert_path),
            "ca_key": str(ca_key),
            "serving_cert": str(serving.cert),
            "serving_key": str(serving.key),
            "kubelet_serving_cert": str(kubelet_serving.cert),
            "kubelet_serving_key": str(kubelet_serving.key),
            "apiserver_kubelet_cert": str(apiserver_kubelet.cert),
            "apiserver_kubelet_key": str(apiserver_kubelet.key),
            "sa_key": str(sa_key),
            "sa_pub": str(sa_pub),
            "admin_cert": str(clients["admin"].cert),
            "admin_key": str(clients["admin"].key),
        }

    def _apiserver_args(self, bins: Path, ports: dict[str, int], creds: dict[str, str]) -> list[str]:
        if self.net is not None:
            # Pods reach it through the kubernetes Service, whose endpoint is this address. The
            # control plane runs no kube-proxy (the node does): the API server calls webhooks and
            # aggregated APIs at their endpoints, as such control planes are told to.
            address = self.net.host_ip
            network = ["--enable-aggregator-routing=true"]
        else:
            # The kubernetes Service cannot have a loopback endpoint (1.37 refuses to start with
            # the default reconciler); on the fake runtime nothing reaches the API through it.
            address, network = "127.0.0.1", ["--endpoint-reconciler-type=none"]
        return [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            *network,
            f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={creds['serving_cert']}",
            f"--tls-private-key-file={creds['serving_key']}",
            f"--client-ca-file={creds['ca']}",
            f"--kubelet-client-certificate={creds['apiserver_kubelet_cert']}",
            f"--kubelet-client-key={creds['apiserver_kubelet_key']}",
            # As kubeadm sets it: the node's name resolves nowhere here.
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            f"--service-account-key-file={creds['sa_pub']}",
            f"--service-account-signing-key-file={creds['sa_key']}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            *_runtime_config_flag(release(self.version).runtime_config),
            f"--feature-gates={_gates_flag(self.gates)}",
            "--v=1",
        ]

    def _start_kubelet(
        self, bins: Path, ports: dict[str, int], creds: dict[str, str], runtime_sock: Path
    ) -> None:
        run = self.run_dir
        assert self.info is not None
        node_ip = self.info.node_ip
        config = {
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
            "featureGates": self.gates,
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
            **self.kubelet_config,
        }
        config_path = run / "kubelet-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        kubelet = [
            str(bins / "kubelet"),
            f"--config={config_path}",
            f"--kubeconfig={run / 'kubelet.kubeconfig'}",
            f"--root-dir={self.info.kubelet_root}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={node_ip}",
            "--v=2",
        ]
        # The kubelet's device-plugin path is hard-coded; inside its own mount
        # namespace that path is a bind of the run's directory.
        setup = " && ".join(
            [
                "mount -t tmpfs tmpfs /var/lib",
                "mount -t tmpfs tmpfs /var/log",
                "mkdir -p /var/lib/kubelet/device-plugins",
                f"mount --bind {self.info.device_plugin_dir} /var/lib/kubelet/device-plugins",
                # containerd's shims put their sockets here whatever its state directory.
                "mkdir -p /run/containerd",
                "mount -t tmpfs tmpfs /run/containerd",
                *self._runtime_setup,
                'exec "$@"',
            ]
        )
        self._kubelet_command = [
            *(self.net.enter() if self.net else []),
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            setup,
            "kubelet",
            *kubelet,
        ]
        self._kubelet_healthz = f"http://{node_ip}:{ports['healthz']}/healthz"
        self._spawn("kubelet", self._kubelet_command, cwd=run / "kubelet-work")

    def _start_kube_proxy(self, bins: Path, net: nodenet.NodeNetwork, deadline: float) -> None:
        """kube-proxy in nftables mode in the node's namespace; returns once it has synced its rules."""
        assert self.info is not None
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.run_dir / "kube-proxy.kubeconfig")},
            "mode": "nftables",
            "clusterCIDR": net.pod_subnet,
            "hostnameOverride": self.node_name,
            "healthzBindAddress": f"{net.node_ip}:{KUBE_PROXY_HEALTHZ_PORT}",
            # Zero leaves the conntrack table's size and timeouts as they are: the machine's
            # settings, which a node's namespace cannot (and must not) change.
            "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "featureGates": self.gates,
        }
        config_path = self.run_dir / "kube-proxy-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        try:
            env = nodenet.nft_env()
        except nodenet.NodeNetworkError as err:
            raise ClusterError(str(err)) from None
        command = [*net.enter(), str(bins / "kube-proxy"), f"--config={config_path}", "--v=1"]
        self._spawn("kube-proxy", command, env=env)
        healthz = f"http://{net.node_ip}:{KUBE_PROXY_HEALTHZ_PORT}/healthz"
        while True:
            self._check_alive()
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(healthz, timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise ClusterError("kube-proxy did not sync its rules in time (see logs/kube-proxy.log)")
            time.sleep(0.2)

    def import_image(self, image: images.Image) -> None:
        """Make an image built here (e.g. localcluster.driverimage's) available to the node's pods."""
        if self.runtime != "containerd":
            raise ClusterError(f"images run on containerd only; this cluster runs on {self.runtime}")
        try:
            containerd.import_image(ensure_containerd_binaries(), self.run_dir, image)
        except RuntimeError as err:
            raise ClusterError(str(err)) from None

    def restart_kubelet(self, timeout: float = 60.0) -> int:
        """Stop the kubelet, start it again with the same flags; return the new kubelet's PID.

        Returns once the new kubelet answers /healthz, has re-created its device-plugin
        registration socket (kubelet.sock) and reports the node Ready. Pods keep running
        on the fake runtime meanwhile; device plugins are expected to notice and register again.
        On containerd, which lives in the kubelet's namespace, the runtime restarts too.
        """
        assert self.info is not None, "start() the cluster first"
        deadline = time.monotonic() + timeout
        socket_path = Path(self.info.device_plugin_dir) / "kubelet.sock"
        before = _file_identity(socket_path)
        stop_processes({"kubelet": self._procs.pop("kubelet").pid})
        self._spawn("kubelet", self._kubelet_command, cwd=self.run_dir / "kubelet-work")
        pid = self._procs["kubelet"].pid
        while True:
            self._check_alive()
            healthy = False
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self._kubelet_healthz, timeout=2) as resp,
            ):
                healthy = resp.status == 200
            current = _file_identity(socket_path)
            if healthy and current is not None and current != before:
                break
            if time.monotonic() > deadline:
                raise ClusterError("the restarted kubelet did not come back (see logs/kubelet.log)")
            time.sleep(0.1)
        self._wait_node_ready(deadline)
        return pid

    def _spawn(
        self, name: str, args: list[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        assert self.info is not None
        with open(self.info.log_path(name), "ab") as log:
            self._procs[name] = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd or self.run_dir,
                env={**os.environ, **env} if env else None,
                start_new_session=True,
            )
        self.add_process(name, self._procs[name].pid)

    def add_process(self, name: str, pid: int) -> None:
        """Record a process of the run in cluster.json, so stop_run_dir() ends it too."""
        assert self.info is not None, "start() the cluster first"
        self.info.pids[name] = pid
        self.info.save()

    def _check_alive(self) -> None:
        assert self.info is not None
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                tail = _tail(self.info.log_path(name))
                raise ClusterError(f"{name} exited with {proc.returncode}; last lines of its log:\n{tail}")

    def _wait_api(self, api: str, creds: dict[str, str], deadline: float) -> None:
        context = ssl.create_default_context(cafile=creds["ca"])
        context.load_cert_chain(creds["admin_cert"], creds["admin_key"])
        while True:
            self._check_alive()
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{api}/readyz", context=context, timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise ClusterError("kube-apiserver did not become ready in time")
            time.sleep(0.2)

    def _wait_node_ready(self, deadline: float) -> None:
        from localcluster.kube import Kube

        assert self.info is not None
        kube = Kube(self.info.kubeconfig)
        try:
            while True:
                self._check_alive()
                node = kube.get_or_none("v1", "Node", self.node_name) if self.kubelet else None
                if not self.kubelet and kube.get_or_none("v1", "ServiceAccount", "default", "default"):
                    return
                ready = node is not None and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in node["status"].get("conditions") or []
                )
                if ready and node is not None:
                    # Node lifecycle is off (it would evict on heartbeat hiccups), so the
                    # harness clears the taint that controller would have cleared.
                    taints = [
                        t
                        for t in node["spec"].get("taints") or []
                        if t["key"] != "node.kubernetes.io/not-ready"
                    ]
                    if taints != (node["spec"].get("taints") or []):
                        kube.patch("v1", "Node", self.node_name, {"spec": {"taints": taints or None}})
                    if kube.get_or_none("v1", "ServiceAccount", "default", namespace="default") is not None:
                        return
                if time.monotonic() > deadline:
                    raise ClusterError("the kubelet's node did not become Ready (see logs/kubelet.log)")
                time.sleep(0.2)
        finally:
            kube.close()

    # -- stop --------------------------------------------------------------

    def stop(self) -> None:
        """End every process (the API server before etcd) and remove the run directory."""
        pids = {name: proc.pid for name, proc in self._procs.items()}
        stop_processes(pids)
        self._procs.clear()
        containerd.stop_leftovers(self.run_dir)
        nodenet.destroy(self.run_dir)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def cluster_dir() -> Path:
    """The directory of the cluster that `make cluster-up` starts (DRA_GPU_CLUSTER_DIR)."""
    return Path(os.environ.get("DRA_GPU_CLUSTER_DIR", "/tmp/dra-gpu-cluster"))


def demo_dir() -> Path:
    """The directory of the cluster that `make demo` starts: beside cluster_dir(), so
    `make cluster-down` finds it."""
    return cluster_dir().with_name(cluster_dir().name + "-demo")


def stop_run_dir(run_dir: Path) -> bool:
    """Stop the processes cluster.json in run_dir names and remove run_dir; False if none ran there.

    For a cluster whose owner is gone (`make cluster-up` returned, or a demo was killed):
    a process is stopped only while its command line still names run_dir, so a stale
    cluster.json never ends an unrelated process that reuses a PID.
    """
    try:
        info = ClusterInfo.load(run_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        shutil.rmtree(run_dir, ignore_errors=True)
        return False
    stop_processes({name: pid for name, pid in info.pids.items() if _runs_in(pid, run_dir)})
    containerd.stop_leftovers(run_dir)
    nodenet.destroy(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def _runs_in(pid: int, run_dir: Path) -> bool:
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(run_dir).encode() in command_line


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt: only `finally` sees it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """The shell's convention for death by this signal: 128 + its number."""
        return 128 + self.signum


#: The signals that end a foreground run: Ctrl-C, kill, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise Stopped in the main thread on SIGINT, SIGTERM or SIGHUP while the block runs.

    A signal that was ignored when the process started stays ignored: nohup ignores SIGHUP
    and a shell ignores SIGINT for background jobs on purpose. After the first signal the
    others are ignored, so a second Ctrl-C cannot interrupt the clean-up it started.
    """

    def handler(signum: int, frame: object) -> None:
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    handled = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


def stop_processes(pids: Mapping[str, int], grace: float = 10.0) -> None:
    """SIGTERM each component in dependency order, SIGKILL what outlives the grace period."""
    for name in sorted(pids, key=lambda n: _STOP_ORDER.index(n) if n in _STOP_ORDER else -1):
        pid = pids[name]
        _signal(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and _alive(pid):
            time.sleep(0.05)
        _signal(pid, signal.SIGKILL)
        _reap(pid)


def _signal(pid: int, sig: int) -> None:
    """Signal the process group a component leads, or the process alone if it leads none
    (the demo's driver shares the demo's group)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, change time) of a file, or None: tells a re-created file from the old one."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _write_kubeconfig(path: Path, server: str, ca: Path, pair: pki.KeyPair) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [
            {"name": "user", "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))


def api_burst(qps: int) -> int:
    """The burst of a raised API rate limit of `qps` requests/s: twice that, for every component."""
    return 2 * qps


def api_limit_flags(qps: int) -> tuple[str, ...]:
    """kube-controller-manager's or kube-scheduler's flags for an API rate limit of `qps` requests/s;
    none for 0 (their defaults: 20 and 30, 50 and 100)."""
    return (f"--kube-api-qps={qps}", f"--kube-api-burst={api_burst(qps)}") if qps > 0 else ()


def kubelet_api_limit(qps: int) -> dict[str, int]:
    """KubeletConfiguration fields for an API rate limit of `qps` requests/s; none for 0.

    The kubelet's default is 50 with a burst of 100; its pods' status updates spend it.
    """
    return {"kubeAPIQPS": qps, "kubeAPIBurst": api_burst(qps)} if qps > 0 else {}


@contextlib.contextmanager
def running_cluster(
    feature_gates: Mapping[str, bool] | None = None,
    controller_manager_args: Sequence[str] = (),
    kubelet_config: Mapping[str, object] | None = None,
) -> Iterator[ClusterInfo]:
    """A started cluster for the duration of the block."""
    cluster = LocalCluster(
        feature_gates=feature_gates,
        controller_manager_args=controller_manager_args,
        kubelet_config=kubelet_config,
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop()
