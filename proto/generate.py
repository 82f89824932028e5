"""Generate the Python gRPC code for the kubelet wire contracts in this directory.

The code lands in ``dra/pb`` (never committed, never edited by hand): message
modules, gRPC stubs and mypy stubs. ``make proto`` runs this, and so does the
package build (``setup.py``), so a wheel or an editable install always carries
code that matches the ``.proto`` sources.

protoc sees this directory under the virtual name ``dra/pb`` so that imports
between generated modules resolve to ``dra.pb...`` inside the package.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
PACKAGE_PATH = "dra/pb"


def proto_files() -> list[Path]:
    """Every .proto source, in a stable order."""
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_root: Path = REPO_ROOT) -> Path:
    """Run protoc over every .proto source and write the package under out_root.

    Returns the generated package directory. Raises RuntimeError with protoc's
    message when a source does not compile.
    """
    from grpc_tools import protoc  # build-time dependency only

    include = Path(protoc.__file__).resolve().parent / "_proto"
    # Next to this Python in a virtualenv; on PATH in pip's isolated build environment.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    plugin = shutil.which("protoc-gen-mypy", path=search)
    plugin_grpc = shutil.which("protoc-gen-mypy_grpc", path=search)
    if plugin is None or plugin_grpc is None:
        raise RuntimeError("mypy-protobuf's protoc-gen-mypy is neither next to this Python nor on PATH")

    target = out_root / PACKAGE_PATH
    # Generate aside and swap in, so a failed run leaves the previous code in place.
    with tempfile.TemporaryDirectory(dir=out_root / Path(PACKAGE_PATH).parent) as scratch:
        args = [
            "protoc",
            f"-I{PACKAGE_PATH}={PROTO_DIR}",
            f"-I{include}",
            f"--python_out={scratch}",
            f"--grpc_python_out={scratch}",
            f"--plugin=protoc-gen-mypy={plugin}",
            f"--plugin=protoc-gen-mypy_grpc={plugin_grpc}",
            f"--mypy_out={scratch}",
            f"--mypy_grpc_out={scratch}",
            *(str(p) for p in proto_files()),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed; its message is above")
        fresh = Path(scratch) / PACKAGE_PATH
        for directory in [fresh, *(d for d in fresh.rglob("*") if d.is_dir())]:
            (directory / "__init__.py").touch()
        (fresh / "py.typed").touch()
        if target.exists():
            shutil.rmtree(target)
        fresh.rename(target)
    return target


if __name__ == "__main__":
    try:
        print(f"generated {generate().relative_to(REPO_ROOT)}")
    except RuntimeError as err:
        sys.exit(f"proto/generate.py: {err}")
