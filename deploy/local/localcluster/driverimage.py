"""The driver's image, deploy/Dockerfile's, built here without Docker (no engine, no registry).

    python -m localcluster.driverimage            # build (or reuse) this tree's image, print its name
    python -m localcluster.driverimage COMMIT     # the same for a commit of the repository's history

The Dockerfile builds ``python:3.11-slim`` plus the wheels of the package and NVIDIA's hook; this
builds the same three stages from what the machine reaches:

1. the build stage: the Dockerfile's build context (its COPY lines, minus what its ignore file
   leaves out) copied to a scratch directory, and the Dockerfile's ``pip wheel`` command run
   there by this Python (3.11, the image's): the package's wheel (its build generates dra/pb)
   and the wheels of its dependencies at the versions of constraints.txt;
2. the hook stage: NVIDIA's nvidia-cdi-hook, built by localcluster.binaries from the same go.mod
   (deploy/local/nvidiabin), statically linked;
3. the final stage: a root filesystem of Debian's CPython 3.11 and the libraries it and the
   wheels load (``apt-get download`` and ``dpkg-deb -x``; nothing is installed on the machine),
   the Dockerfile's ``pip install`` command run inside it with ``chroot`` by the image's own
   Python (pip itself is lent from this environment and not left in the image), the dra-gpu
   user, the hook at /usr/bin/nvidia-cdi-hook, and the Dockerfile's USER, ENV, ENTRYPOINT and
   CMD as the image config.

tests/unit/test_deploy_image.py keeps the commands, the context and the config equal to the
Dockerfile's. The build checks that every installed distribution is the version
constraints.txt pins and that ``dra-gpu --help`` runs, then writes an OCI layout tarball
(localcluster.images) named ``dra-gpu.local/dra-gpu:<version>-<key>``, where the key hashes the
build context and this recipe: a changed source gives a new image, an unchanged one the cached
tarball. A commit's image is built from ``git archive`` of that commit the same way (the chart
upgrade test's previous release).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from localcluster import debs, releases
from localcluster.binaries import ensure_nvidia_cdi_hook
from localcluster.gomodule import BuildError, cache_root
from localcluster.images import REGISTRY, Image, tree_layer, write_oci_tarball

ROOT = Path(__file__).resolve().parents[3]
REPOSITORY = f"{REGISTRY}/dra-gpu"
#: The image's interpreter (Debian's) and its minor, which the wheels are built for.
PYTHON = "/usr/bin/python3.11"
PYTHON_MINOR = (3, 11)
#: Debian's CPython 3.11 and every library it, its standard library's extension modules and the
#: wheels' extension modules load (apt-get resolves nothing here: each is named).
RUNTIME_PACKAGES = (
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libssl3",
    "libbz2-1.0",
    "liblzma5",
    "libcrypt1",
    "libncursesw6",
    "libtinfo6",
    "libreadline8",
    "libsqlite3-0",
    "libuuid1",
    "libnsl2",
    "libtirpc3",
    "libtirpc-common",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libcom-err2",
    "libkeyutils1",
    "libdb5.3",
)
#: What the packages bring that an image does not need (python:3.11-slim has none of it either).
TRIMMED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian")

#: The Dockerfile's build context (its COPY sources); its ignore file leaves out dra/pb and caches.
CONTEXT = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "constraints.txt",
    "proto",
    "dra",
    "deploy/local/nvidiabin/go.mod",
    "deploy/local/nvidiabin/go.sum",
)
#: The hook stage's part of the context (a commit from before it has none, and builds no hook).
HOOK_CONTEXT = CONTEXT[-2:]
#: Where the Dockerfile's hook stage puts NVIDIA's nvidia-cdi-hook (built here by localcluster.binaries
#: from the same go.mod, statically linked as there).
HOOK = "/usr/bin/nvidia-cdi-hook"
#: Where the Dockerfile puts the wheels; the commands below name it so that a test can compare.
WHEELS = "/wheels"
#: The Dockerfile's two pip commands: the build stage's, then the final stage's.
WHEEL_COMMAND = (
    "pip",
    "wheel",
    "--no-cache-dir",
    "--constraint",
    "constraints.txt",
    "--wheel-dir",
    WHEELS,
    ".",
)
INSTALL_COMMAND = ("pip", "install", "--no-cache-dir", "--no-index", "--find-links", WHEELS, "dra-gpu")
#: The user the Dockerfile's useradd makes, and the final stage's config.
USER_NAME, USER_ID = "dra-gpu", 65532
ENV = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
ENTRYPOINT = ["dra-gpu"]
CMD = ["--help"]
#: The PATH of python:3.11-slim, where pip's console scripts land (/usr/local/bin).
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class DriverImage(Image):
    """The driver's image: the tarball, and what the chart's image values are for it."""

    repository: str
    tag: str
    #: The installed distributions, name==version, as the build found them.
    packages: tuple[str, ...]

    @property
    def size(self) -> int:
        """The tarball's size in bytes (one uncompressed layer)."""
        return self.tarball.stat().st_size


def _copy_context(source: Path, into: Path) -> None:
    def left_out(directory: str, names: list[str]) -> set[str]:
        ignored = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        return ignored | ({"pb"} & set(names) if Path(directory) == source / "dra" else set())

    for name in CONTEXT:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, into / name, ignore=left_out)
        elif path.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, into / name)
        else:
            raise BuildError(f"the image's build context lacks {name} (in {source})")


def _key(context: Path) -> str:
    """A hash of the build context's files and of this recipe."""
    digest = hashlib.sha256()
    recipe = [
        RUNTIME_PACKAGES,
        TRIMMED,
        WHEEL_COMMAND,
        INSTALL_COMMAND,
        USER_NAME,
        USER_ID,
        ENV,
        ENTRYPOINT,
        CMD,
    ]
    digest.update(json.dumps(recipe, sort_keys=True).encode())
    for path in sorted(context.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(context).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _version(context: Path) -> str:
    try:
        return releases.tree_version(context)
    except releases.ReleaseError as err:
        raise BuildError(str(err)) from None


@contextlib.contextmanager
def staged_context(commit: str | None) -> Iterator[Path]:
    """The build context of this tree (None) or of a commit, in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-context-") as tmp:
        context = Path(tmp)
        if commit is None:
            _copy_context(ROOT, context)
        else:
            # An older commit's Dockerfile builds no hook: its context lacks the hook's go.mod.
            present = [
                name
                for name in CONTEXT
                if subprocess.run(
                    ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{name}"],
                    capture_output=True,
                    check=False,
                ).returncode
                == 0
                or name not in HOOK_CONTEXT
            ]
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "--", *present],
                capture_output=True,
                check=False,
            )
            if archive.returncode != 0:
                raise BuildError(
                    f"git archive {commit} failed (a shallow clone lacks the history: "
                    f"git fetch --unshallow): {archive.stderr.decode(errors='replace').strip()}"
                )
            subprocess.run(["tar", "-x", "-C", str(context)], input=archive.stdout, check=True)
        yield context


def _run(command: list[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise BuildError(f"{what} failed ({done.returncode}):\n{tail}")
    return done.stdout


def _pins(context: Path) -> dict[str, str]:
    pins = {}
    for line in (context / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[_normal(name)] = version.strip()
    return pins


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _pip_package_dir() -> Path:
    spec = importlib.util.find_spec("pip")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("pip is needed in the Python that builds the image (python -m ensurepip)")
    return Path(next(iter(spec.submodule_search_locations)))


def _build(context: Path, image: str, tarball: Path, log: bool) -> None:
    if sys.version_info[:2] != PYTHON_MINOR:
        raise BuildError(
            f"the image's Python is {'.'.join(map(str, PYTHON_MINOR))}: build it with that Python "
            f"(this is {sys.version.split()[0]}), so that the wheels fit"
        )
    chroot = shutil.which("chroot")
    if os.geteuid() != 0 or chroot is None:
        raise BuildError("the image's pip install runs inside its root filesystem with chroot: run as root")
    started = time.monotonic()
    if log:
        print(f"building {image} (wheels, Debian's Python 3.11, pip install)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=tarball.parent) as tmp:
        work = Path(tmp)
        wheels, rootfs = work / "wheels", work / "rootfs"
        wheel = [sys.executable, "-m", *(str(wheels) if arg == WHEELS else arg for arg in WHEEL_COMMAND)]
        _run(wheel, "pip wheel of the package", cwd=context)
        debs.unpack(RUNTIME_PACKAGES, rootfs, "the image's Python runtime")
        for trimmed in TRIMMED:
            shutil.rmtree(rootfs / trimmed, ignore_errors=True)
        # Debian marks its Python as apt's to manage; in an image there is no apt, as in python:*-slim.
        (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
        scratch = rootfs / "tmp"
        shutil.copytree(_pip_package_dir(), scratch / "pip-lent" / "pip")
        shutil.copytree(wheels, scratch / WHEELS.strip("/"))
        install = [
            chroot,
            str(rootfs),
            PYTHON,
            "-m",
            *(f"/tmp{WHEELS}" if arg == WHEELS else arg for arg in INSTALL_COMMAND),
        ]
        _run(
            install,
            "pip install in the image",
            # HOME as a RUN step has it: pip looks for its cache there.
            env={"PYTHONPATH": "/tmp/pip-lent", "PATH": PATH, "HOME": "/root"},
        )
        shutil.rmtree(scratch)
        scratch.mkdir(mode=0o1777)
        scratch.chmod(0o1777)
        _add_user(rootfs)
        if (context / HOOK_CONTEXT[0]).is_file():
            hook = rootfs / HOOK.lstrip("/")
            shutil.copy2(ensure_nvidia_cdi_hook(log), hook)
            hook.chmod(0o755)
            _run([chroot, str(rootfs), HOOK, "--version"], "nvidia-cdi-hook --version in the image", env={})
        listed = _run(
            [chroot, str(rootfs), PYTHON, "-c", _LIST_DISTRIBUTIONS], "listing the image's packages", env={}
        )
        installed = json.loads(listed)
        pins = _pins(context)
        unpinned = [f"{n}=={v}" for n, v in installed.items() if n != "dra-gpu" and pins.get(n) != v]
        if unpinned:
            raise BuildError(f"the image holds versions constraints.txt does not pin: {', '.join(unpinned)}")
        _run(
            [chroot, "--userspec", f"{USER_ID}:{USER_ID}", str(rootfs), *ENTRYPOINT, *CMD],
            "dra-gpu --help in the image",
            env={"PATH": PATH, **ENV},
        )
        (work / "packages.json").write_text(json.dumps(installed, indent=1, sort_keys=True))
        config = {
            "User": USER_NAME,
            "Env": [f"PATH={PATH}", "LANG=C.UTF-8", *(f"{k}={v}" for k, v in ENV.items())],
            "Entrypoint": ENTRYPOINT,
            "Cmd": CMD,
        }
        write_oci_tarball(tarball, image, tree_layer(rootfs), config)
        (work / "packages.json").replace(_packages_file(tarball))
    if log:
        size = tarball.stat().st_size / 2**20
        print(f"built {image} ({size:.0f} MiB) in {time.monotonic() - started:.0f}s", file=sys.stderr)


#: Run by the image's Python: its distributions, {normalised name: version}.
_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json, re; "
    "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version "
    "for d in m.distributions()}))"
)


def _add_user(rootfs: Path) -> None:
    """/etc/passwd and /etc/group with root and the Dockerfile's dra-gpu user (useradd --system ...)."""
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\n{USER_NAME}:x:{USER_ID}:{USER_ID}::/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\n{USER_NAME}:x:{USER_ID}:\n")


#: How many of the driver's images the cache keeps (each source change makes one of 180 MiB).
KEPT_IMAGES = 4


def _prune(directory: Path) -> None:
    """Remove all but the KEPT_IMAGES most recently used images of the driver."""
    tarballs = sorted(directory.glob("dra-gpu-*.tar"), key=lambda t: t.stat().st_mtime, reverse=True)
    for old in tarballs[KEPT_IMAGES:]:
        for path in (old, _packages_file(old), old.with_name(f".{old.stem}.lock")):
            path.unlink(missing_ok=True)


def _packages_file(tarball: Path) -> Path:
    return tarball.with_suffix(".packages.json")


def driver_image(commit: str | None = None, log: bool = True) -> DriverImage:
    """The image of this tree (None) or of a commit, built into the cache on first use.

    About 20 s cold on two cores (downloading wheels and packages, the pip install, the
    layer); a cached image costs the context's hash (a few tenths of a second). The cache
    keeps the KEPT_IMAGES most recently used.
    """
    with staged_context(commit) as context:
        tag = f"{_version(context)}-{_key(context)}"
        name = f"{REPOSITORY}:{tag}"
        tarball = cache_root() / "images" / f"dra-gpu-{tag}.tar"
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with open(tarball.parent / f".dra-gpu-{tag}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (tarball.is_file() and _packages_file(tarball).is_file()):
                _build(context, name, tarball, log)
            # Its modification time says when it was last used: the oldest ones go.
            os.utime(tarball)
    _prune(tarball.parent)
    packages = json.loads(_packages_file(tarball).read_text())
    return DriverImage(
        name=name,
        tarball=tarball,
        repository=REPOSITORY,
        tag=tag,
        packages=tuple(f"{n}=={v}" for n, v in sorted(packages.items())),
    )


if __name__ == "__main__":
    try:
        built = driver_image(sys.argv[1] if len(sys.argv) > 1 else None)
    except BuildError as err:
        sys.exit(f"localcluster.driverimage: {err}")
    print(built.name)
    print(
        f"{built.tarball} ({built.size / 2**20:.0f} MiB, {len(built.packages)} distributions)",
        file=sys.stderr,
    )
