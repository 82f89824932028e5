"""The Helm chart in deploy/helm/dra-gpu, rendered by the project's pinned helm.

Tests render it to check what admins would install; `make manifests` (this
module's command line) gives Chart.yaml the release's version (dra.__version__, the
one place: docs/releases.md) and writes the plain manifests of deploy/manifests from it:

    python -m localcluster.chart manifests   # the chart's version, then deploy/manifests
    python -m localcluster.chart template [helm template flags...]
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from localcluster import releases
from localcluster.binaries import ensure_binary
from localcluster.kube import Obj, load_manifests

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "dra-gpu"
MANIFESTS = ROOT / "deploy" / "manifests"
KIND = ROOT / "deploy" / "kind"

#: deploy/manifests is the chart with its defaults, as release dra-gpu in namespace dra-gpu,
#: and the namespace rendered too (helm users get it from --create-namespace instead).
MANIFEST_RELEASE = "dra-gpu"
MANIFEST_NAMESPACE = "dra-gpu"
MANIFEST_VALUES: dict[str, Any] = {"namespace": {"create": True}}
MANIFEST_HEADER = (
    "# Rendered from deploy/helm/dra-gpu (default values, release dra-gpu, namespace dra-gpu)\n"
    "# by `make manifests`; edit the chart, not this file.\n"
)


class HelmError(RuntimeError):
    """helm failed; the message has its output."""


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the pinned helm (built on first use) with no cluster access and no user config."""
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = {
            "HOME": home,
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data",
            "PATH": "/usr/bin:/bin",
        }
        result = subprocess.run(
            [str(ensure_binary("helm")), *args], capture_output=True, text=True, env=env, check=False
        )
    if check and result.returncode != 0:
        raise HelmError(
            f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return result


@contextlib.contextmanager
def values_flags(values: Mapping[str, Any] | None = None, files: Iterable[Path] = ()) -> Iterator[list[str]]:
    """--values flags for files and for a dict (written to a temporary file for the block)."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-values-") as tmp:
        args = [arg for path in files for arg in ("--values", str(path))]
        if values:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(dict(values)))
            args += ["--values", str(path)]
        yield args


def template_text(
    values: Mapping[str, Any] | None = None,
    files: Iterable[Path] = (),
    release: str = MANIFEST_RELEASE,
    namespace: str = MANIFEST_NAMESPACE,
    extra: Sequence[str] = (),
) -> str:
    """`helm template` output of the chart."""
    with values_flags(values, files) as flags:
        return helm("template", release, str(CHART), "--namespace", namespace, *flags, *extra).stdout


def template(
    values: Mapping[str, Any] | None = None,
    files: Iterable[Path] = (),
    release: str = MANIFEST_RELEASE,
    namespace: str = MANIFEST_NAMESPACE,
    extra: Sequence[str] = (),
) -> list[Obj]:
    """The chart's objects, as dicts."""
    return load_manifests(template_text(values, files, release, namespace, extra))


def lint(
    values: Mapping[str, Any] | None = None, files: Iterable[Path] = (), extra: Sequence[str] = ()
) -> str:
    """`helm lint --strict`; returns its output, raises HelmError on any finding above INFO."""
    with values_flags(values, files) as flags:
        return helm("lint", "--strict", str(CHART), *flags, *extra).stdout


def split_by_template(text: str) -> dict[str, str]:
    """Rendered text grouped by template file name (helm's `# Source:` comments), in render order."""
    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith("# Source: "):
            name = Path(line.removeprefix("# Source: ").strip()).name
            current = files.setdefault(name, [])
            if current:
                current.append("---\n")
            continue
        if line.rstrip() == "---":
            continue
        if current is not None:
            current.append(line)
    return {name: "".join(lines) for name, lines in files.items()}


def render_manifests() -> dict[str, str]:
    """The files of deploy/manifests: one per chart template, and the kustomization listing them."""
    rendered = split_by_template(template_text(MANIFEST_VALUES))
    files = {name: MANIFEST_HEADER + body for name, body in rendered.items()}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(rendered),
    }
    files["kustomization.yaml"] = MANIFEST_HEADER + yaml.safe_dump(kustomization, sort_keys=False)
    return files


def write_manifests(directory: Path = MANIFESTS) -> list[Path]:
    """Re-render deploy/manifests, removing files no template renders any more."""
    files = render_manifests()
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.yaml"):
        if stale.name not in files:
            stale.unlink()
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


#: Chart.yaml's two version lines: the chart's own and the version of what it installs.
_CHART_VERSION = re.compile(r"^version: .*$", re.MULTILINE)
_APP_VERSION = re.compile(r"^appVersion: .*$", re.MULTILINE)


def write_chart_version(version: str, chart_file: Path = CHART / "Chart.yaml") -> bool:
    """Give Chart.yaml `version` as its version and appVersion (comments kept); whether it changed."""
    text = chart_file.read_text()
    new = _CHART_VERSION.sub(f"version: {version}", text, count=1)
    new = _APP_VERSION.sub(f'appVersion: "{version}"', new, count=1)
    if new == text:
        return False
    staging = chart_file.with_name(f".{chart_file.name}.{os.getpid()}.tmp")
    staging.write_text(new)
    staging.replace(chart_file)
    return True


def kind_chart_args() -> list[str]:
    """The release, chart and flags deploy/kind/up.sh installs with, as the script prints them."""
    script = KIND / "up.sh"
    result = subprocess.run(["bash", str(script), "chart-args"], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["manifests"]:
        chart_file = CHART / "Chart.yaml"
        if write_chart_version(releases.tree_version(ROOT), chart_file):
            print(chart_file.relative_to(ROOT))
        for path in write_manifests():
            print(path.relative_to(ROOT))
        return 0
    if args[:1] == ["template"]:
        result = helm("template", MANIFEST_RELEASE, str(CHART), *args[1:], check=False)
        print(result.stdout, end="")
        print(result.stderr, end="", file=sys.stderr)
        return result.returncode
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
