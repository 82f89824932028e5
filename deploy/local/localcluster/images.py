"""The two images a cluster on containerd runs, built here: no registry is reachable or needed.

- ``dra-gpu.local/pause:<version>``: the sandbox image, Kubernetes' own pause.c (from the
  k8s.io/kubernetes module the cluster's binaries are built from, build/pause/linux),
  compiled with ``gcc -static`` as its Makefile does;
- ``dra-gpu.local/busybox:<version>``: a static busybox from Debian's busybox-static
  package (``apt-get download`` and ``dpkg-deb -x``; nothing is installed), with a link
  per applet in /bin, for test pods that run ``sh``, ``ls``, ``env`` and the fake nvidia-smi.

The driver's own image is localcluster.driverimage's, written the same way.

Each is written as an OCI image layout tarball (the layout of the OCI image spec:
``oci-layout``, ``index.json`` and ``blobs/sha256/*``; one uncompressed layer, one
config, one manifest) with the standard library, then imported with
``ctr -n k8s.io images import``. The tarballs are cached beside the binaries
(``<cache>/images/``), keyed by what they are built from.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster import debs
from localcluster.binaries import KUBERNETES
from localcluster.gomodule import BuildError, cache_root

REGISTRY = "dra-gpu.local"
PAUSE_VERSION = "3.10"
PAUSE_IMAGE = f"{REGISTRY}/pause:{PAUSE_VERSION}"
BUSYBOX_PACKAGE = "busybox-static"
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Image:
    """An image tarball ready for `ctr images import`."""

    name: str
    tarball: Path


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add(
    tar: tarfile.TarFile, name: str, data: bytes | None = None, *, mode: int = 0o755, link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    if link:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer(files: dict[str, bytes], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # The mount points a runtime expects; CDI adds /dev/nvidia* and the driver's paths itself.
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/bin", "var", "var/run"):
            _add(tar, directory, mode=0o1777 if directory == "tmp" else 0o755)
        for name, data in sorted(files.items()):
            _add(tar, name, data)
        for name, target in sorted(links.items()):
            _add(tar, name, link=target)
    return buffer.getvalue()


def tree_layer(root: Path) -> bytes:
    """A layer of everything under `root` (a root filesystem), owned by root:root as a build's files are."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name, filter=owned_by_root)
    return buffer.getvalue()


def _name_annotations(name: str) -> dict[str, str]:
    # containerd names the imported image after the first.
    return {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}


def image_name(tarball: Path) -> str:
    """The name an OCI layout tarball of write_oci_tarball's gives its image."""
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        [manifest] = json.loads(member.read())["manifests"]
    return str(manifest["annotations"]["io.containerd.image.name"])


def rename_oci_tarball(source: Path, name: str, target: Path) -> None:
    """A copy of an OCI layout tarball of write_oci_tarball's naming its image `name`: the same
    manifest, config and layer bytes (the same digests), only index.json's annotations differ."""
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with tarfile.open(source) as src, tarfile.open(staging, "w") as out:
        for member in src:
            data = src.extractfile(member) if member.isfile() else None
            if member.name == "index.json" and data is not None:
                index = json.loads(data.read())
                for manifest in index["manifests"]:
                    manifest["annotations"] = _name_annotations(name)
                _add(out, "index.json", json.dumps(index).encode(), mode=0o644)
            else:
                out.addfile(member, data)
    staging.replace(target)


def write_oci_tarball(path: Path, name: str, layer: bytes, config: dict[str, Any]) -> None:
    """An OCI image layout tarball of one layer, naming the image `name` (registry/repo:tag)."""
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [_sha256(layer)]},
    }
    config_blob = json.dumps(image_config, sort_keys=True).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha256(config_blob),
                "size": len(config_blob),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _sha256(layer),
                    "size": len(layer),
                }
            ],
        },
        sort_keys=True,
    ).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _sha256(manifest),
                "size": len(manifest),
                "annotations": _name_annotations(name),
            }
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # A staging name of this process's own: test workers (pytest-xdist) may build the same image at once.
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tarfile.open(staging, "w") as tar:
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), mode=0o644)
        _add(tar, "index.json", json.dumps(index).encode(), mode=0o644)
        for blob in (layer, config_blob, manifest):
            _add(tar, f"blobs/sha256/{_sha256(blob).split(':')[1]}", blob, mode=0o644)
    staging.replace(path)


def _pause_source() -> Path:
    listed = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
        cwd=KUBERNETES.directory,
        capture_output=True,
        text=True,
        check=False,
    )
    source = Path(listed.stdout.strip()) / "build/pause/linux/pause.c"
    if listed.returncode != 0 or not source.is_file():
        raise BuildError(
            f"cannot find Kubernetes' pause.c through `go list -m k8s.io/kubernetes`: {listed.stderr}"
        )
    return source


def pause_image() -> Image:
    """The sandbox image, compiled from Kubernetes' pause.c on first use."""
    source = _pause_source()
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    tarball = cache_root() / "images" / f"pause-{PAUSE_VERSION}-{key}.tar"
    if not tarball.is_file():
        if shutil.which("gcc") is None:
            raise BuildError(
                "gcc (with a static libc, e.g. Debian's libc6-dev) is needed to build the pause image"
            )
        print(f"building the pause image from {source}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            binary = Path(tmp) / "pause"
            compiled = subprocess.run(
                [
                    "gcc",
                    "-Os",
                    "-Wall",
                    "-static",
                    f"-DVERSION=v{PAUSE_VERSION}-dra-gpu",
                    "-o",
                    str(binary),
                    str(source),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if compiled.returncode != 0:
                raise BuildError(
                    f"gcc -static pause.c failed (is a static libc installed?):\n{compiled.stderr}"
                )
            layer = _layer({"pause": binary.read_bytes()}, {})
        write_oci_tarball(tarball, PAUSE_IMAGE, layer, {"Entrypoint": ["/pause"], "Env": [_PATH]})
    return Image(PAUSE_IMAGE, tarball)


def busybox_image() -> Image:
    """The test image: Debian's static busybox, downloaded (not installed) on first use."""
    cached = sorted((cache_root() / "images").glob("busybox-*.tar"))
    if cached:
        return Image(_busybox_name(cached[-1]), cached[-1])
    print(f"fetching {BUSYBOX_PACKAGE} with apt-get download", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        [deb] = debs.unpack([BUSYBOX_PACKAGE], Path(tmp) / "root", BUSYBOX_PACKAGE)
        busybox = Path(tmp) / "root/bin/busybox"
        applets = subprocess.run(
            [str(busybox), "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        # The package version, e.g. 1:1.35.0-4+deb12u1+b1 -> 1.35.0-4-deb12u1-b1, as the tag.
        version = deb.split("_")[1].split("%3a")[-1].replace("+", "-")
        layer = _layer(
            {"bin/busybox": busybox.read_bytes()},
            {f"bin/{applet}": "busybox" for applet in applets if applet != "busybox"},
        )
    tarball = cache_root() / "images" / f"busybox-{version}.tar"
    write_oci_tarball(tarball, f"{REGISTRY}/busybox:{version}", layer, {"Cmd": ["sh"], "Env": [_PATH]})
    return Image(_busybox_name(tarball), tarball)


def _busybox_name(tarball: Path) -> str:
    return f"{REGISTRY}/busybox:{tarball.stem.removeprefix('busybox-')}"
