"""`make release`: a release's artefacts, built from a clean tree at its commit, into dist/<version>/.

    python -m localcluster.dist [--output-dir DIR]

- ``dra_gpu-<version>-py3-none-any.whl``: the package, built by pip from the image's build context;
- ``dra-gpu-<version>.oci.tar``: the image (localcluster.driverimage: deploy/Dockerfile's recipe
  without Docker), an OCI image layout tarball naming it as the chart's defaults resolve it
  (``docker.io/library/dra-gpu:<version>``); ``skopeo copy oci-archive:...`` or
  ``ctr images import`` puts it where the nodes pull from;
- ``dra-gpu-<version>.tgz``: the chart, ``helm package`` by the project's pinned helm;
- ``SHA256SUMS`` of the three.

Refused, with one line saying why: a tree with changes or files git does not ignore (a release
is its commit and nothing else), a HEAD that is not a release (the commit that set the version,
localcluster.releases), a chart or deploy/manifests that do not say the version. Checked before
the folder is written: each artefact's name and content say the version, the image holds the
package at that version, and the packaged chart, rendered with its defaults and with every
component on, runs exactly the image built. Nothing is uploaded.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml

from localcluster import chart, driverimage, images, releases
from localcluster.gomodule import BuildError
from localcluster.kube import load_manifests

ROOT = releases.ROOT
DIST = ROOT / "dist"
#: Every component on: the kubelet plugin's DaemonSet with its device plugin and labeller, the webhook.
EVERY_COMPONENT = {
    "webhook": {"enabled": True},
    "devicePlugin": {"enabled": True},
    "gpuAssignment": {"devicePlugin": "0"},
    "nodeLabeller": {"enabled": True},
}
T = TypeVar("T")


class RefusedError(RuntimeError):
    """This tree cannot be released as it is; the message says why and what to do."""


def normalized(reference: str) -> str:
    """An image reference as the kubelet and containerd resolve it (docker.io/library/ for a bare name)."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if rest else f"docker.io/library/{reference}"


def check_clean(root: Path = ROOT) -> None:
    """RefusedError while the tree differs from its commit (changes, or files git does not ignore)."""
    status = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    if status:
        raise RefusedError(
            f"the tree has {len(status)} changed or untracked path(s) (first: {status[0].strip()}): "
            "a release is built from its commit alone; commit or remove them"
        )


def check_at_release(root: Path = ROOT) -> releases.Release:
    """The release HEAD is; RefusedError when it is none, naming the commit that set its version."""
    release = releases.release_at(root)
    if release is not None:
        return release
    version = releases.tree_version(root)
    set_by = next((r for r in releases.releases(root) if r.version == version), None)
    where = f"released at {set_by.commit[:12]}" if set_by else "never released"
    raise RefusedError(
        f"HEAD is not a release: its version {version} was {where}. Check out a release (make "
        "releases lists them) or make one: a commit that sets a new version (docs/releases.md)"
    )


def check_chart_says(version: str) -> None:
    """RefusedError unless Chart.yaml and deploy/manifests say `version` as `make manifests` writes them."""
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    said = {key: str(meta.get(key)) for key in ("version", "appVersion")}
    if said != {"version": version, "appVersion": version}:
        raise RefusedError(
            f"Chart.yaml says {said}, dra/__init__.py {version}: run make manifests and commit"
        )
    committed = {p.name: p.read_text() for p in chart.MANIFESTS.glob("*.yaml")}
    if committed != chart.render_manifests():
        raise RefusedError("deploy/manifests differ from the chart's render: run make manifests and commit")


def build_wheel(version: str, into: Path) -> Path:
    """The package's wheel, built by pip from the image's build context."""
    with driverimage.staged_context(None) as context:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(into), str(context)],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise BuildError(f"pip wheel failed ({done.returncode}):\n{done.stderr[-2000:]}")
    wheel = into / f"dra_gpu-{version}-py3-none-any.whl"
    if not wheel.is_file():
        raise BuildError(f"pip wheel made {sorted(p.name for p in into.iterdir())}, not {wheel.name}")
    return wheel


def rendered_images(packaged: Path) -> set[str]:
    """The images the packaged chart runs, with its defaults and with every component on."""
    found = set()
    for values in ({}, EVERY_COMPONENT):
        with chart.values_flags(values) as flags:
            text = chart.helm("template", chart.MANIFEST_RELEASE, str(packaged), *flags).stdout
        for obj in load_manifests(text):
            pod = obj.get("spec", {}).get("template", {}).get("spec", {})
            for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                found.add(container["image"])
    return found


def _timed(what: str, step: Callable[[], T], figures: dict[str, float]) -> T:
    started = time.monotonic()
    print(f"release: {what}", file=sys.stderr, flush=True)
    result = step()
    figures[what] = time.monotonic() - started
    return result


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _build_into(work: Path, version: str, name: str, figures: dict[str, float]) -> tuple[Path, ...]:
    """The three artefacts and SHA256SUMS in `work`, each checked; the three."""
    wheel = _timed("the wheel (pip wheel)", lambda: build_wheel(version, work), figures)
    image = _timed("the image (localcluster.driverimage)", driverimage.driver_image, figures)
    if f"dra-gpu=={version}" not in image.packages:
        raise BuildError(f"the image holds {[p for p in image.packages if p.startswith('dra-gpu==')]}")
    tarball = work / f"dra-gpu-{version}.oci.tar"
    _timed(
        "the image named as the chart names it",
        lambda: images.rename_oci_tarball(image.tarball, name, tarball),
        figures,
    )
    _timed(
        "the chart (helm package)",
        lambda: chart.helm("package", str(chart.CHART), "--destination", str(work)),
        figures,
    )
    packaged = work / f"dra-gpu-{version}.tgz"
    if not packaged.is_file():
        raise BuildError(f"helm package made {sorted(p.name for p in work.iterdir())}, not {packaged.name}")
    runs = {normalized(i) for i in rendered_images(packaged)}
    if runs != {images.image_name(tarball)}:
        raise BuildError(f"the packaged chart runs {sorted(runs)} by default, not the image built ({name})")
    artefacts = (wheel, tarball, packaged)
    (work / "SHA256SUMS").write_text("".join(f"{_sha256(p)}  {p.name}\n" for p in artefacts))
    return artefacts


def build(output_dir: Path = DIST) -> Path:
    """Check the tree, build the artefacts, check them, and move them into <output_dir>/<version>."""
    check_clean()
    release = check_at_release()
    version = release.version
    check_chart_says(version)
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    name = normalized(f"{values['image']['repository']}:{version}")
    figures: dict[str, float] = {}
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=output_dir))
    try:
        artefacts = _build_into(work, version, name, figures)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    target = output_dir / version
    if target.exists():
        shutil.rmtree(target)
    work.rename(target)
    # mkdtemp made it for this user alone; the folder is for whoever installs the release.
    target.chmod(0o755)
    print(f"dra-gpu {version}: release {release.commit[:12]} of {release.date}, into {target}")
    for artefact in (*artefacts, Path("SHA256SUMS")):
        path = target / artefact.name
        print(f"  {path.name:<36} {_size(path.stat().st_size):>10}")
    print("  " + ", ".join(f"{what}: {seconds:.0f} s" for what, seconds in figures.items()))
    print(f"  the chart runs {name} by default: the image above")
    return target


def main(argv: list[str] | None = None) -> int:
    """Entry point; 1 with one line on stderr when the tree is refused or a build fails."""
    parser = argparse.ArgumentParser(prog="make release", description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, default=DIST, help="where <version>/ is written (dist)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        build(args.output_dir)
    except (RefusedError, releases.ReleaseError) as err:
        print(f"make release: refused: {err}", file=sys.stderr)
        return 1
    except (BuildError, chart.HelmError) as err:
        print(f"make release: {err}", file=sys.stderr)
        return 1
    print(f"  {time.monotonic() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
