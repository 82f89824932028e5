"""`make test-changed`: which tests a change selects (tests/changed.py), and what it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import changed


@pytest.fixture(scope="module")
def graph() -> changed.Graph:
    return changed.Graph()


@pytest.mark.parametrize(
    ("path", "module"),
    [
        ("dra/daemon/flags.py", "dra.daemon.flags"),
        ("dra/cli/__init__.py", "dra.cli"),
        ("deploy/local/localcluster/kube.py", "localcluster.kube"),
        ("deploy/local/fakenvml/node.py", "fakenvml.node"),
        ("tests/unit/test_cli.py", "tests.unit.test_cli"),
        ("proto/generate.py", None),
        ("docs/sharing.md", None),
    ],
)
def test_a_path_is_the_module_it_is_imported_as(path: str, module: str | None) -> None:
    assert changed.module_name(path) == module


def test_a_module_selects_the_tests_that_import_it_directly_or_not(graph: changed.Graph) -> None:
    selection = changed.select(["dra/daemon/flags.py"], graph)
    assert "tests.unit.test_cli" in selection.tests  # through dra.cli.parser
    assert "tests.unit.cel.test_differential" not in selection.tests
    assert not selection.everything
    assert selection.tests["tests.unit.test_cli"] == {"dra/daemon/flags.py"}


def test_a_module_selects_the_tests_that_run_the_program_as_a_process(graph: changed.Graph) -> None:
    # daemon.py is imported by none of them: they start `python -m dra kubelet-plugin`, or its image.
    tests = graph.importers("dra.kubeletplugin.daemon")
    assert "tests.unit.test_mpsprivsep" in tests
    assert "tests.e2e.test_device_taints" in tests
    assert "tests.e2e.test_chart_install" in tests
    assert "tests.unit.test_claimstatus" not in graph.importers("dra.kubeletplugin.daemon")


def test_a_packages_init_selects_the_tests_importing_any_of_its_modules(graph: changed.Graph) -> None:
    # test_slices imports dra.core.slices, never `dra` itself: importing it runs dra/__init__.py.
    assert "tests.unit.test_slices" in changed.select(["dra/__init__.py"], graph).tests


def test_a_changed_test_selects_itself(graph: changed.Graph) -> None:
    assert "tests.unit.test_cli" in changed.select(["tests/unit/test_cli.py"], graph).tests


@pytest.mark.parametrize(
    ("path", "test"),
    [
        ("docs/sharing.md", "tests.unit.test_sharing_docs"),
        ("tests/e2e/nvidia_specs/bats-gpu-mps.yaml", "tests.e2e.test_nvidia_specs"),
        ("docs/examples/multi-tenancy/quota.yaml", "tests.e2e.test_multi_tenancy"),
    ],
)
def test_another_file_selects_the_tests_that_name_it(graph: changed.Graph, path: str, test: str) -> None:
    selection = changed.select([path], graph)
    assert test in selection.tests
    assert not selection.everything


@pytest.mark.parametrize("path", ["pyproject.toml", "tests/conftest.py", "docs/no-test-names-this.md"])
def test_a_file_every_run_reads_or_none_names_selects_every_test(graph: changed.Graph, path: str) -> None:
    selection = changed.select([path], graph)
    assert selection.everything
    assert set(selection.tests) == set(graph.closures)
    assert changed.command(selection, with_cluster=False, pytest_args=()) == [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "not cluster",
    ]


def test_the_command_runs_the_selected_files_and_their_cluster_tests_only_when_asked(
    graph: changed.Graph,
) -> None:
    selection = changed.select(["docs/sharing.md"], graph)
    line = changed.command(selection, with_cluster=False, pytest_args=("-n", "4"))
    assert line[3:] == ["-n", "4", "-m", "not cluster", "tests/unit/test_sharing_docs.py"]
    assert "not cluster" not in changed.command(selection, with_cluster=True, pytest_args=())


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True)


def test_changed_files_are_committed_staged_unstaged_and_untracked_ones_since_the_merge_base(
    tmp_path: Path,
) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    for name in ("kept", "edited", "staged", "committed"):
        (tmp_path / name).write_text("a\n")
    (tmp_path / ".gitignore").write_text("ignored\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "base")
    _git(tmp_path, "checkout", "-q", "-b", "work")
    (tmp_path / "committed").write_text("b\n")
    _git(tmp_path, "commit", "-q", "-am", "change")
    _git(tmp_path, "checkout", "-q", "main")
    (tmp_path / "kept").write_text("changed on main only\n")
    _git(tmp_path, "commit", "-q", "-am", "main moves on")
    _git(tmp_path, "checkout", "-q", "work")
    (tmp_path / "edited").write_text("b\n")
    (tmp_path / "staged").write_text("b\n")
    _git(tmp_path, "add", "staged")
    (tmp_path / "new").write_text("b\n")
    (tmp_path / "ignored").write_text("b\n")
    assert changed.changed_files("main", tmp_path) == ["committed", "edited", "new", "staged"]
    assert changed.changed_files("work", tmp_path) == ["edited", "new", "staged"]
