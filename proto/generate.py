"""Generate the Python gRPC code for the kubelet wire contracts in this directory.

The code lands in ``dra/pb`` (never committed, never edited by hand): message
modules, gRPC stubs and mypy stubs. ``make proto`` runs this, and so does the
package build (``setup.py``), so a wheel or an editable install always carries
code that matches the ``.proto`` sources.

protoc sees this directory under the virtual name ``dra/pb`` so that imports
between generated modules resolve to ``dra.pb...`` inside the package.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
PACKAGE_PATH = "dra/pb"


def proto_files() -> list[Path]:
    """Every .proto source, in a stable order."""
    return sorted(PROTO_DIR.rglob("*.proto"))


def _script(name: str) -> str | None:
    """A console script next to this Python (a venv), else on PATH.

    pip's isolated build environment (`pip install .`, `pip wheel .`) installs the build
    requirements into an overlay whose scripts are on PATH but not next to sys.executable.
    """
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def generate(out_root: Path = REPO_ROOT) -> Path:
    """Run protoc over every .proto source and write the package under out_root.

    Returns the generated package directory. Raises RuntimeError with protoc's
    message when a source does not compile.
    """
    from grpc_tools import protoc  # build-time dependency only

    target = out_root / PACKAGE_PATH
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)

    include = Path(protoc.__file__).resolve().parent / "_proto"
    plugin = _script("protoc-gen-mypy")
    plugin_grpc = _script("protoc-gen-mypy_grpc")
    if plugin is None or plugin_grpc is None:
        raise RuntimeError("mypy-protobuf is not installed next to this Python nor on PATH (protoc-gen-mypy)")
    args = [
        "protoc",
        f"-I{PACKAGE_PATH}={PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={plugin}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_grpc}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *(str(p) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; its message is above")

    for directory in [target, *(d for d in target.rglob("*") if d.is_dir())]:
        (directory / "__init__.py").touch()
    (target / "py.typed").touch()
    return target


if __name__ == "__main__":
    try:
        print(f"generated {generate().relative_to(REPO_ROOT)}")
    except RuntimeError as err:
        sys.exit(f"proto/generate.py: {err}")
