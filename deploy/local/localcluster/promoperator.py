"""The Prometheus Operator's CRDs, as it publishes them, to check the chart's PodMonitor against.

The operator's Go module (github.com/prometheus-operator/prometheus-operator) carries its CRDs
under example/prometheus-operator-crd/; ``go mod download`` fetches it through the module proxy
into Go's module cache, the first time only, and the module's hash is checked against the one
pinned here, as go.sum would. A test installs the CRD into the local API server, which then
validates the rendered PodMonitor against the operator's own schema.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from localcluster.gomodule import BuildError

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
#: The module's hash (go.sum's h1: line) at VERSION.
SUM = "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="


def crd(plural: str) -> Path:
    """The CRD file of one kind, e.g. crd("podmonitors"), downloaded on first use."""
    if shutil.which("go") is None:
        raise BuildError(f"the Go toolchain is needed to fetch {MODULE} (its CRDs)")
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BuildError(f"go mod download {MODULE}@{VERSION} failed: {done.stderr.strip() or done.stdout}")
    info = json.loads(done.stdout)
    if info.get("Sum") != SUM:
        raise BuildError(f"{MODULE}@{VERSION} has hash {info.get('Sum')}, not the pinned {SUM}")
    path = Path(info["Dir"]) / "example" / "prometheus-operator-crd" / f"monitoring.coreos.com_{plural}.yaml"
    if not path.is_file():
        raise BuildError(f"{MODULE}@{VERSION} has no CRD {path.name}")
    return path
