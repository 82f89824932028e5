"""The chart installed with helm on a cluster on containerd, as an admin installs it.

The image is the one localcluster.driverimage builds (imported into the node's containerd,
as an admin pushes theirs to a registry), and the values are the ones any admin of such a
node sets: the image, the kubelet's root (this node's kubelet runs with a --root-dir of the
run's) and the runtime's CDI directory, and fake GPUs through the chart's own value. Nothing
else differs from the chart's defaults.

previous() is the release the upgrade test starts from, found in the history
(localcluster.releases): the newest release whose image context or chart differs from this
tree's, so that each release is tested against the one before it. Its chart comes from
``git archive`` of its commit and its image is built the same way as this tree's (cached by
what it is built from). A shallow clone fails with the command that fetches the history.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from localcluster import chart, releases
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverimage import DriverImage
from localcluster.gomodule import BuildError

RELEASE = "dra-gpu"
NAMESPACE = "dra-gpu"
#: The fake GPUs of the demo's claims: whole H100s and MIG devices.
PROFILE = "h100x8-mig"
#: The release's DaemonSet pods: its selector labels (dra-gpu.selectorLabels), which the webhook's
#: pods carry too, with a component label of their own.
POD_SELECTOR = (
    f"app.kubernetes.io/name=dra-gpu,app.kubernetes.io/instance={RELEASE},!app.kubernetes.io/component"
)


@functools.cache
def previous() -> releases.Release:
    """The release to upgrade from (found once per process); ReleaseError when the history cannot say."""
    return releases.previous_release()


def node_values(info: ClusterInfo, image: DriverImage, profile: str = PROFILE) -> dict[str, Any]:
    """The values an admin of this node sets: the image, the kubelet's root, the CDI directory, fake GPUs."""
    return {
        "image": {"repository": image.repository, "tag": image.tag},
        "kubeletDir": info.kubelet_root,
        "cdiDir": info.cdi_dir,
        "fakeGpus": {"enabled": True, "profile": profile},
    }


@contextlib.contextmanager
def chart_at(commit: str | None) -> Iterator[Path]:
    """The chart of this tree (None), or of a commit of the repository's history (git archive)."""
    if commit is None:
        yield chart.CHART
        return
    relative = chart.CHART.relative_to(chart.ROOT)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-chart-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(chart.ROOT), "archive", "--format=tar", commit, "--", str(relative)],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise BuildError(
                f"git archive {commit} failed (a shallow clone lacks the history: git fetch "
                f"--unshallow): {archive.stderr.decode(errors='replace').strip()}"
            )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp) / relative


class Helm:
    """The pinned helm against one cluster and release, as an admin runs it (--wait on changes)."""

    def __init__(self, info: ClusterInfo, release: str = RELEASE, namespace: str = NAMESPACE) -> None:
        self.info = info
        self.release = release
        self.namespace = namespace

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return chart.helm(*args, "--kubeconfig", self.info.kubeconfig, "--namespace", self.namespace)

    def install(self, chart_dir: Path, values: Mapping[str, Any], timeout: str = "180s") -> str:
        """`helm install --create-namespace --wait`; its output."""
        with chart.values_flags(values) as flags:
            args = ("install", self.release, str(chart_dir), "--create-namespace", *flags)
            return self._run(*args, "--wait", "--timeout", timeout).stdout

    def upgrade(self, chart_dir: Path, values: Mapping[str, Any], timeout: str = "180s") -> str:
        """`helm upgrade --wait` to this chart with exactly these values; its output."""
        with chart.values_flags(values) as flags:
            args = ("upgrade", self.release, str(chart_dir), *flags, "--wait", "--timeout", timeout)
            return self._run(*args).stdout

    def rollback(self, revision: int, timeout: str = "180s") -> str:
        """`helm rollback --wait` to a revision; its output."""
        return self._run("rollback", self.release, str(revision), "--wait", "--timeout", timeout).stdout

    def uninstall(self, timeout: str = "120s") -> str:
        """`helm uninstall --wait`; its output."""
        return self._run("uninstall", self.release, "--wait", "--timeout", timeout).stdout

    def revision(self) -> int:
        """The release's current revision."""
        listed = self._run("list", "--filter", f"^{self.release}$", "--output", "json").stdout
        [entry] = json.loads(listed)
        return int(entry["revision"])
