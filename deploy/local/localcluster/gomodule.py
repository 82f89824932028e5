"""A Go module under deploy/local, the commands it yields, and their build into the per-user cache.

localcluster.binaries names each module (what it pins, what it builds); this is how any of
them is built: `go build` into a staging directory beside the cache entry, under a file lock
(concurrent callers wait instead of building twice), each binary renamed into place whole,
progress said every PROGRESS_EVERY seconds. Standard library only: `make cluster-binaries` runs
it with the system Python, before the virtual environment exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO


class BuildError(RuntimeError):
    """The binaries could not be built; the message says why and what to install."""


def _binary_name(package: str) -> str:
    """The name `go build -o <dir>` gives a package's binary: the last element of its path."""
    return package.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class GoModule:
    """A Go module under tests/ and the commands built from it."""

    #: The cache subdirectory, e.g. "k8s".
    name: str
    directory: Path
    #: The required module whose version names the build, e.g. k8s.io/kubernetes.
    pinned: str
    #: Packages to build, in `go build` syntax; each yields a binary named after its last element.
    packages: tuple[str, ...]
    #: -ldflags for the pinned version.
    ldflags: Callable[[str], str]
    #: A go.mod for another version beside the module's own (`go build -modfile`); None: go.mod.
    modfile: Path | None = None
    #: `go build -tags`; part of the cache key.
    tags: tuple[str, ...] = ()
    #: Extra environment of the build (e.g. where cgo finds a library), prepared on first build.
    build_env: Callable[[], dict[str, str]] | None = None
    #: One package of `packages` that is a multi-call program, and the commands it serves: the
    #: cache holds it once per command, as hard links named after them, and it runs the one it
    #: is called as. The other packages yield one binary each.
    multicall: tuple[str, tuple[str, ...]] | None = None

    @property
    def commands(self) -> tuple[str, ...]:
        """The binaries this module yields."""
        served = self.multicall[1] if self.multicall else ()
        return served + tuple(
            _binary_name(package)
            for package in self.packages
            if self.multicall is None or package != self.multicall[0]
        )

    @property
    def go_mod(self) -> Path:
        """The go.mod this build uses: the modfile, else the module's own."""
        return self.modfile or self.directory / "go.mod"

    def package_of(self, command: str) -> str:
        """The package that yields one command."""
        if self.multicall is not None and command in self.multicall[1]:
            return self.multicall[0]
        return next(package for package in self.packages if _binary_name(package) == command)

    def version(self) -> str:
        """The version go.mod requires of the pinned module, e.g. v1.34.12."""
        text = self.go_mod.read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.pinned)} (v\S+)", text, re.MULTILINE)
        if match is None:
            raise BuildError(f"{self.go_mod} does not require {self.pinned}")
        return match.group(1)

    def go_version(self) -> str:
        """The Go release go.mod asks for, e.g. 1.25.0."""
        match = re.search(r"^go (\S+)", self.go_mod.read_text(), re.MULTILINE)
        return match.group(1) if match else "1.25"

    def source_hash(self) -> str:
        """A hash of the module's Go sources, go.mod and go.sum, and of the modfile and its .sum."""
        digest = hashlib.sha256()
        for path in sorted(self.directory.rglob("*")):
            if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
                digest.update(path.relative_to(self.directory).as_posix().encode())
                digest.update(path.read_bytes())
        # Only a modfile or tagged build hashes more, so the default build keeps the key it always had.
        if self.tags:
            digest.update(("tags:" + ",".join(self.tags)).encode())
        if self.modfile is not None:
            for path in (self.modfile, self.modfile.with_suffix(".sum")):
                digest.update(path.name.encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()[:12]

    def bin_dir(self) -> Path:
        """Where this module's binaries live (whether built yet or not)."""
        return cache_root() / self.name / f"{self.version()}-{self.source_hash()}"

    def missing(self, commands: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """Which of these commands (default: all) are not in the cache yet."""
        target = self.bin_dir()
        return tuple(name for name in commands or self.commands if not (target / name).is_file())

    def is_built(self) -> bool:
        """Whether every command is in the cache."""
        return not self.missing()


def cache_root() -> Path:
    """DRA_GPU_CACHE_DIR, else $XDG_CACHE_HOME/dra-gpu, else ~/.cache/dra-gpu."""
    explicit = os.environ.get("DRA_GPU_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-gpu"


#: How often a build in progress says how far it got.
PROGRESS_EVERY = 15.0


class _BuildOutput:
    """Reads `go build -v` output as it comes: counts progress, keeps what is not progress."""

    def __init__(self, stream: IO[str]) -> None:
        self.downloads = 0
        self.packages = 0
        self.messages: list[str] = []
        self._stream = stream
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            if line.startswith("go: downloading "):
                self.downloads += 1
            elif line.strip() and " " not in line.strip():
                # -v names each package as it is compiled, one import path a line.
                self.packages += 1
            else:
                self.messages.append(line)

    def join(self) -> None:
        self._reader.join()


def _build(module: GoModule, commands: tuple[str, ...], log: bool) -> None:
    target = module.bin_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        commands = module.missing(commands)
        if not commands:
            return
        version = module.version()
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        env = dict(os.environ, GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
        if module.build_env is not None:
            env.update(module.build_env())
        modfile = [f"-modfile={module.modfile}"] if module.modfile else []
        tags = ["-tags", ",".join(module.tags)] if module.tags else []
        if log:
            print(
                f"building {', '.join(commands)} ({version}) into {target}; the first build downloads "
                "the modules and compiles for several minutes, progress every "
                f"{PROGRESS_EVERY:.0f}s ...",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                "go",
                "build",
                "-v",
                *modfile,
                *tags,
                "-trimpath",
                "-ldflags",
                module.ldflags(version),
                "-o",
                str(staging),
                *dict.fromkeys(module.package_of(name) for name in commands),
            ],
            cwd=module.directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        output = _BuildOutput(proc.stdout)
        while True:
            try:
                proc.wait(timeout=PROGRESS_EVERY)
                break
            except subprocess.TimeoutExpired:
                if log:
                    elapsed = time.monotonic() - started
                    print(
                        f"  ... {elapsed // 60:.0f}m{elapsed % 60:02.0f}s: {output.downloads} modules "
                        f"downloaded, {output.packages} packages compiled",
                        file=sys.stderr,
                        flush=True,
                    )
        output.join()
        if proc.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuildError(f"go build failed in {module.directory}:\n{''.join(output.messages)}")
        target.mkdir(exist_ok=True)
        # One rename per command: a reader sees each binary whole or not at all. A command of
        # the multi-call binary is a hard link to it (staged beside it, then renamed): unlike a
        # symbolic link, /proc/<pid>/exe then names the command too.
        for name in commands:
            built = staging / _binary_name(module.package_of(name))
            if built.name != name:
                os.link(built, staging / name)
            os.replace(staging / name, target / name)
        shutil.rmtree(staging, ignore_errors=True)
        if log:
            print(f"built in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def _need_go(module: GoModule, what: str) -> None:
    if shutil.which("go") is None:
        raise BuildError(f"the Go toolchain (go >= {module.go_version()}) is needed to build {what}")


def ensure_built(
    module: GoModule, what: str | None, log: bool, commands: tuple[str, ...] | None = None
) -> Path:
    """Build the commands of `module` (default: all) not in the cache yet; the module's binary directory.

    `what` names the build in the error when Go is missing (None: the missing commands).
    """
    missing = module.missing(commands)
    if missing:
        _need_go(module, what or ", ".join(missing))
        _build(module, missing, log)
    return module.bin_dir()
