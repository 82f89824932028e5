"""The node's network of a cluster on containerd: a network namespace, as a real node has a host of its own.

A pod reaches the API server the way it does on a real cluster: the kubelet gives it
``KUBERNETES_SERVICE_HOST``, the ClusterIP of the ``kubernetes`` Service (10.0.0.1), and
kube-proxy on the node turns that address into the API server's advertised address. That
takes a node whose network is not the machine's: kube-proxy rewrites its namespace's whole
nftables ruleset, which two clusters on one machine (or the machine's own rules) cannot share,
and the API server must advertise an address that pods can route to, which 127.0.0.1 is not.

So each cluster's node is a network namespace of its own (kept by a bind mount on
``<run>/netns``): the kubelet, containerd (and so every pod's host-side veth, made by the ptp
plugin) and kube-proxy run in it, joined to the machine by one veth pair in the run's /24 of
10.88.0.0/16, say 10.88.N.0/24:

- pods get 10.88.N.2-250 (gateway 10.88.N.1 on the node's side of each pod's veth);
- the link is 10.88.N.252/30: the machine's end ``dragpuN`` is .253, where the control plane
  listens and which the API server advertises; the node's end ``eth0`` is .254, the node's
  InternalIP (the kubelet's serving and health ports);
- the machine routes 10.88.N.0/24 to the node, so that the API server reaches the pods (the
  webhook's endpoints: it routes to endpoints, as a control plane without kube-proxy is set to).

The node has no default route: a packet for any address but the machine's end of the link and
the pods stops there. Nothing leaves the machine; ``stop`` unmounts the namespace, which
removes the veth pair and the route with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localcluster import debs
from localcluster.gomodule import BuildError, cache_root

#: The node's nft (kube-proxy's nftables mode runs it) and the libraries it loads beyond libc,
#: from Debian, unpacked into the cache.
NFT_PACKAGES = (
    "nftables",
    "libnftables1",
    "libnftnl11",
    "libmnl0",
    "libjansson4",
    "libxtables12",
    "libgmp10",
    "libedit2",
    "libbsd0",
    "libmd0",
    "libtinfo6",
)
#: The node's interface on the link, inside its namespace.
NODE_INTERFACE = "eth0"


class NodeNetworkError(RuntimeError):
    """The node's namespace or link could not be made; the message says what to fix."""


@dataclass(frozen=True)
class NodeNetwork:
    """One cluster's node network: 10.88.<index>.0/24."""

    run: Path
    index: int

    @property
    def netns(self) -> Path:
        """The bind mount that keeps the namespace."""
        return self.run / "netns"

    @property
    def pod_subnet(self) -> str:
        """The pods' addresses (and the link's /30 at its end)."""
        return f"10.88.{self.index}.0/24"

    @property
    def pod_range(self) -> tuple[str, str]:
        """The first and last address host-local gives pods (below the link's /30)."""
        return f"10.88.{self.index}.2", f"10.88.{self.index}.250"

    @property
    def host_ip(self) -> str:
        """The machine's end of the link: the control plane's address."""
        return f"10.88.{self.index}.253"

    @property
    def node_ip(self) -> str:
        """The node's end of the link: its InternalIP."""
        return f"10.88.{self.index}.254"

    @property
    def host_interface(self) -> str:
        """The machine's end of the link (at most 15 characters)."""
        return f"dragpu{self.index}"

    def enter(self) -> list[str]:
        """A command prefix that runs a command in the node's namespace."""
        return ["nsenter", f"--net={self.netns}"]


def _ip(*args: str, node: NodeNetwork | None = None) -> subprocess.CompletedProcess[str]:
    prefix = node.enter() if node is not None else []
    return subprocess.run([*prefix, "ip", *args], capture_output=True, text=True, check=False)


def _must(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise NodeNetworkError(f"{what}: {' '.join(done.args)} failed: {done.stderr.strip()}")


def create(run: Path, tries: int = 16) -> NodeNetwork:
    """Make the node's namespace and link, in the first free /24 from the one `run` hashes to."""
    for tool in ("ip", "nsenter", "unshare", "mount", "umount"):
        if shutil.which(tool) is None:
            raise NodeNetworkError(f"{tool} (iproute2, util-linux) is needed for the node's network")
    first = hashlib.sha256(str(run).encode()).digest()[0]
    netns = run / "netns"
    netns.touch()
    made = subprocess.run(["unshare", f"--net={netns}", "true"], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise NodeNetworkError(f"cannot make the node's network namespace: {made.stderr.strip()}")
    try:
        for step in range(tries):
            net = NodeNetwork(run, (first + step) % 250 + 1)
            # The machine's end is made last but named first: another cluster's link of the same
            # /24 makes this fail, and the next /24 is tried.
            linked = _ip(
                "link", "add", NODE_INTERFACE, "type", "veth", "peer", "name", net.host_interface,
                "netns", str(os.getpid()), node=net,
            )  # fmt: skip
            if linked.returncode == 0 and not _routed(net):
                _configure(net)
                return net
            _ip("link", "del", NODE_INTERFACE, node=net)
    except BaseException:
        destroy(run)
        raise
    destroy(run)
    raise NodeNetworkError(f"no free /24 of 10.88.0.0/16 for the node's network after {tries} tries")


def _routed(net: NodeNetwork) -> bool:
    """Whether the machine already routes the /24, or a part of it (a network not this cluster's)."""
    return bool(_ip("-4", "route", "show", "root", net.pod_subnet).stdout.strip())


def _configure(net: NodeNetwork) -> None:
    host, node = net.host_interface, NODE_INTERFACE
    _must(_ip("addr", "add", f"{net.host_ip}/30", "dev", host), "the machine's end of the node's link")
    _must(_ip("link", "set", host, "up"), "the machine's end of the node's link")
    _must(_ip("route", "add", net.pod_subnet, "via", net.node_ip, "dev", host), "the route to the pods")
    _must(_ip("addr", "add", f"{net.node_ip}/30", "dev", node, node=net), "the node's end of its link")
    _must(_ip("link", "set", node, "up", node=net), "the node's end of its link")
    _must(_ip("link", "set", "lo", "up", node=net), "the node's loopback")
    # The node forwards between the pods' veths and its link (ptp would also turn this on, per pod).
    forwarding = subprocess.run(
        [*net.enter(), "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
        capture_output=True,
        text=True,
        check=False,
    )
    _must(forwarding, "IP forwarding in the node's namespace")


def destroy(run: Path) -> None:
    """Unmount the node's namespace: with its last process gone, its link and route go too."""
    netns = run / "netns"
    if _mounted(netns):
        subprocess.run(["umount", "--lazy", str(netns)], capture_output=True, check=False)
    with contextlib.suppress(FileNotFoundError):
        netns.unlink()


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == str(path) for line in table)


def nft_env() -> dict[str, str]:
    """PATH and LD_LIBRARY_PATH that give kube-proxy Debian's nft, unpacked into the cache on first use."""
    key = hashlib.sha256(" ".join(NFT_PACKAGES).encode()).hexdigest()[:12]
    target = cache_root() / "nftables" / key
    nft = target / "usr/sbin/nft"
    if not nft.is_file():
        # A staging directory of this process's own: test workers may start containerd clusters at once.
        staging = target.with_name(f".{key}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            debs.unpack(NFT_PACKAGES, staging, "nft for kube-proxy")
        except BuildError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise NodeNetworkError(str(err)) from None
        if not nft.is_file():
            shutil.rmtree(target, ignore_errors=True)
        try:
            staging.rename(target)
        except OSError:
            # Another process put its own there first.
            shutil.rmtree(staging, ignore_errors=True)
    libraries = [target / "usr/lib/x86_64-linux-gnu", target / "lib/x86_64-linux-gnu"]
    return {
        "PATH": f"{nft.parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH": ":".join(map(str, libraries)),
    }
