"""deploy/Dockerfile is consistent with the package and the chart.

No Docker engine here: these checks read the Dockerfile. Its build steps run for real in
localcluster.driverimage, which builds the same image without Docker for the chart's tests on the
containerd cluster; the checks below keep its commands, context and config the Dockerfile's, so
that both images hold the same packages (the versions constraints.txt pins, which that build checks).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

from localcluster import chart, driverimage

ROOT = chart.ROOT
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def _args(name: str) -> list[str]:
    return [rest for word, rest in _instructions() if word == name]


def test_base_image_is_a_slim_python_the_package_supports() -> None:
    [python_version] = [rest.split("=", 1)[1] for rest in _args("ARG") if rest.startswith("PYTHON_VERSION=")]
    required = PYPROJECT["project"]["requires-python"]
    assert required == ">=3.11"
    assert tuple(int(p) for p in python_version.split(".")) >= (3, 11)
    assert _args("FROM") == [
        "python:${PYTHON_VERSION}-slim AS build",
        "golang:1.26-bookworm AS hook",
        "python:${PYTHON_VERSION}-slim",
    ]


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    ignore = IGNORE.read_text().splitlines()
    assert ignore[ignore.index("*") :].count("*") == 1, "the ignore file starts from nothing"
    copies = [rest for rest in _args("COPY") if not rest.startswith("--from=")]
    sources = [src for rest in copies for src in rest.split()[:-1]]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
        assert f"!{source}" in ignore, f"COPY {source}: {IGNORE.name} keeps it out of the build context"
    # What the package build reads: pyproject's readme, setup.py's proto/generate.py, the constraints.
    needed = {
        PYPROJECT["project"]["readme"],
        "setup.py",
        "pyproject.toml",
        "proto/",
        "dra/",
        "constraints.txt",
    }
    assert needed <= set(sources)
    assert "dra/pb/" in ignore, "generated code is rebuilt inside the image, never copied"


def test_entrypoint_is_the_packages_console_script_and_the_charts_command() -> None:
    [entrypoint] = _args("ENTRYPOINT")
    command = json.loads(entrypoint)
    assert command == ["dra-gpu"]
    assert command[0] in PYPROJECT["project"]["scripts"]
    [daemonset] = [o for o in chart.template() if o["kind"] == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == command[0]


def test_image_runs_as_the_dra_gpu_user_it_creates() -> None:
    assert _args("USER") == ["dra-gpu"]
    assert any(re.search(r"\buseradd\b.*\bdra-gpu$", rest) for rest in _args("RUN"))


def test_install_uses_the_tested_dependency_versions() -> None:
    wheel, install = (rest for rest in _args("RUN") if "pip " in rest)
    assert "--constraint constraints.txt" in wheel
    assert "--no-index" in install, "the final stage installs only the wheels the build stage made"
    pinned = {
        re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    runtime = {
        re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[]", dep)[0]).lower()
        for dep in PYPROJECT["project"]["dependencies"]
    }
    assert runtime <= pinned, f"unpinned runtime dependencies: {sorted(runtime - pinned)}"


def test_the_local_build_runs_the_dockerfiles_pip_commands() -> None:
    wheel, install = (rest for rest in _args("RUN") if "pip " in rest)
    assert wheel.split() == list(driverimage.WHEEL_COMMAND)
    assert install.split("&&")[0].split() == list(driverimage.INSTALL_COMMAND)
    assert _args("WORKDIR") == ["/src"], "the build stage's pip wheel runs in the build context"
    assert f"--from=build {driverimage.WHEELS} {driverimage.WHEELS}" in _args("COPY")


def test_the_local_build_copies_the_dockerfiles_build_context() -> None:
    copies = [rest for rest in _args("COPY") if not rest.startswith("--from=")]
    sources = {src.rstrip("/") for rest in copies for src in rest.split()[:-1]}
    assert sources == set(driverimage.CONTEXT)


def test_the_local_image_has_the_dockerfiles_user_environment_and_command() -> None:
    [useradd] = [rest for rest in _args("RUN") if "useradd" in rest]
    assert f"--uid {driverimage.USER_ID}" in useradd
    assert useradd.endswith(driverimage.USER_NAME)
    assert _args("USER") == [driverimage.USER_NAME]
    [env] = _args("ENV")
    assert dict(pair.split("=", 1) for pair in env.split()) == driverimage.ENV
    assert json.loads(_args("ENTRYPOINT")[0]) == driverimage.ENTRYPOINT
    assert json.loads(_args("CMD")[0]) == driverimage.CMD
    [python_version] = [rest.split("=", 1)[1] for rest in _args("ARG") if rest.startswith("PYTHON_VERSION=")]
    assert tuple(int(p) for p in python_version.split(".")) == driverimage.PYTHON_MINOR


def test_the_local_build_context_leaves_out_what_the_ignore_file_does() -> None:
    with driverimage.staged_context(None) as context:
        assert sorted(p.name for p in context.iterdir()) == sorted(
            {c.split("/")[0] for c in driverimage.CONTEXT}
        )
        assert (context / "deploy/local/nvidiabin/go.mod").is_file()
        assert not (context / "dra" / "pb").exists(), "generated code is rebuilt by the wheel's build"
        assert not list(context.rglob("__pycache__"))
        assert (context / "dra" / "cli" / "__init__.py").is_file()


def test_the_image_key_follows_every_byte_of_the_context(tmp_path: Path) -> None:
    for name, text in (("pyproject.toml", "a"), ("dra/x.py", "b")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    key = driverimage._key(tmp_path)
    assert driverimage._key(tmp_path) == key
    (tmp_path / "dra/x.py").write_text("c")
    assert driverimage._key(tmp_path) != key


def test_the_cache_keeps_the_most_recently_used_images(tmp_path: Path) -> None:
    for age, tag in enumerate("abcdef"):
        tarball = tmp_path / f"dra-gpu-0.1.0-{tag}.tar"
        for path in (tarball, tarball.with_suffix(".packages.json")):
            path.write_text("{}")
            os.utime(path, (1000 - age, 1000 - age))
    driverimage._prune(tmp_path)
    kept = sorted(p.name for p in tmp_path.glob("*.tar"))
    assert kept == [f"dra-gpu-0.1.0-{tag}.tar" for tag in "abcd"][: driverimage.KEPT_IMAGES]
    assert len(list(tmp_path.glob("*.packages.json"))) == driverimage.KEPT_IMAGES
