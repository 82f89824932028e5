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

Everything of one run lives in one directory, and cluster.json there
(localcluster.clusterinfo) names each process as soon as it starts, so
localcluster.processes.stop_run_dir() (`make cluster-down`) can end a cluster whose
owner died; stop() ends every process and removes that directory. restart_kubelet()
stops only the kubelet and starts it again as before (same flags, a fresh mount
namespace set up the same way), as a node's kubelet restarts: device plugins
must then register again. The Kubernetes release and what each minor needs turned
on are localcluster.kubereleases'.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import yaml
from fakenvml.fakecuda import install_driver_libraries

from dra.fakegpus import node as fakegpus
from localcluster import containerd, images, nodeconfig, nodenet, pki
from localcluster.binaries import ensure_cluster_binaries, ensure_containerd_binaries, kubernetes_version
from localcluster.clusterinfo import NODE_NAME, ClusterError, ClusterInfo
from localcluster.kubereleases import default_feature_gates, gates_flag, release, runtime_config_flag
from localcluster.processes import file_identity, log_tail, stop_processes

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
            control_plane, node = (
                (self.net.host_ip, self.net.node_ip) if self.net else ("127.0.0.1", "127.0.0.1")
            )
            creds = pki.cluster_credentials(run, api, self.node_name, control_plane, node)
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
            gates = gates_flag(self.gates)
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
            *runtime_config_flag(release(self.version).runtime_config),
            f"--feature-gates={gates_flag(self.gates)}",
            "--v=1",
        ]

    def _start_kubelet(
        self, bins: Path, ports: dict[str, int], creds: dict[str, str], runtime_sock: Path
    ) -> None:
        run = self.run_dir
        assert self.info is not None
        node_ip = self.info.node_ip
        config = {
            **nodeconfig.kubelet_configuration(run, node_ip, ports, creds, runtime_sock, self.gates),
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
        config = nodeconfig.kube_proxy_configuration(self.run_dir, net, self.node_name, self.gates)
        config_path = self.run_dir / "kube-proxy-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        try:
            env = nodenet.nft_env()
        except nodenet.NodeNetworkError as err:
            raise ClusterError(str(err)) from None
        command = [*net.enter(), str(bins / "kube-proxy"), f"--config={config_path}", "--v=1"]
        self._spawn("kube-proxy", command, env=env)
        healthz = f"http://{net.node_ip}:{nodeconfig.KUBE_PROXY_HEALTHZ_PORT}/healthz"
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
        before = file_identity(socket_path)
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
            current = file_identity(socket_path)
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
                tail = log_tail(self.info.log_path(name))
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
