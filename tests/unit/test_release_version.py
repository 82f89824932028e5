"""One version for everything a release ships: dra.__version__, and every part that must say it.

The package (pyproject.toml reads it), the chart's version and appVersion, the image the chart
runs by default, deploy/manifests, the image's tag, the metric and the command line. A
disagreement fails here; `make manifests` writes the chart's and the manifests' copies.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import yaml
from localcluster import chart, dist, driverimage, releases
from localcluster.kube import load_manifests
from prometheus_client import generate_latest

from dra import __version__
from dra.cli.parser import parse_args
from dra.daemon import metrics

CHART_FILE = chart.CHART / "Chart.yaml"


def test_the_version_is_major_minor_patch_in_its_one_place() -> None:
    releases.version_key(__version__)
    assert releases.tree_version() == __version__


def test_the_package_reads_its_version_from_the_one_place() -> None:
    project = tomllib.loads((chart.ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dra.__version__"}


def test_the_chart_says_the_version_as_its_own_and_its_apps() -> None:
    meta = yaml.safe_load(CHART_FILE.read_text())
    assert (str(meta["version"]), str(meta["appVersion"])) == (__version__, __version__), "run make manifests"


def test_the_chart_runs_the_versions_image_by_default_in_every_component() -> None:
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == "", "an empty tag is the chart's appVersion"
    for given in ({}, dist.EVERY_COMPONENT):
        objects = chart.template(given)
        pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")]
        found = {c["image"] for pod in pods for c in pod["containers"] + pod.get("initContainers", [])}
        assert found == {f"{values['image']['repository']}:{__version__}"}


def test_the_packaged_chart_is_named_with_the_version_and_runs_its_image(tmp_path: Path) -> None:
    chart.helm("package", str(chart.CHART), "--destination", str(tmp_path))
    [packaged] = tmp_path.iterdir()
    assert packaged.name == f"dra-gpu-{__version__}.tgz"
    assert dist.rendered_images(packaged) == {f"dra-gpu:{__version__}"}


def test_the_manifests_say_the_version_in_their_labels_and_image() -> None:
    objects = [o for p in sorted(chart.MANIFESTS.glob("*.yaml")) for o in load_manifests(p.read_text())]
    labelled = [o["metadata"].get("labels", {}) for o in objects if o.get("kind") != "Kustomization"]
    assert {labels.get("helm.sh/chart") for labels in labelled} == {f"dra-gpu-{__version__}"}
    assert {labels.get("app.kubernetes.io/version") for labels in labelled} == {__version__}
    [daemonset] = [o for o in objects if o.get("kind") == "DaemonSet"]
    assert {c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]} == {
        f"dra-gpu:{__version__}"
    }


def test_make_manifests_writes_the_version_into_chart_yaml_and_keeps_the_rest(tmp_path: Path) -> None:
    copy = tmp_path / "Chart.yaml"
    shutil.copy(CHART_FILE, copy)
    assert not chart.write_chart_version(__version__, copy), "already the version: nothing written"
    assert chart.write_chart_version("9.8.7", copy)
    text = copy.read_text()
    assert yaml.safe_load(text)["version"] == "9.8.7"
    assert yaml.safe_load(text)["appVersion"] == "9.8.7"
    assert text.replace("9.8.7", __version__) == CHART_FILE.read_text()


def test_the_image_is_tagged_with_the_version() -> None:
    with driverimage.staged_context(None) as context:
        assert driverimage._version(context) == __version__


@pytest.mark.parametrize(
    "registry",
    [metrics.REGISTRY, metrics.DEVICE_PLUGIN_REGISTRY, metrics.LABELLER_REGISTRY, metrics.WEBHOOK_REGISTRY],
)
def test_every_program_serves_its_version_as_build_info(registry: metrics.CollectorRegistry) -> None:
    text = generate_latest(registry).decode()
    assert f'{metrics.BUILD_INFO}{{version="{__version__}"}} 1.0' in text.splitlines()


def test_dash_dash_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"dra-gpu {__version__}\n"
