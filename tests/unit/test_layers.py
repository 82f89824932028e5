"""The layers as written (docs/architecture.md, package docstrings) against the contracts and what runs."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict[str, Any]]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        contracts: list[dict[str, Any]] = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    return contracts


def _layers(contract: dict[str, Any]) -> list[list[str]]:
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def _packages() -> list[str]:
    """dra's sub-packages of more than one module, but the generated gRPC code."""
    return sorted(
        path.parent.name
        for path in (ROOT / "dra").glob("*/__init__.py")
        if path.parent.name != "pb" and len(list(path.parent.glob("*.py"))) > 2
    )


def _inner(package: str) -> dict[str, Any]:
    found = [c for c in _contracts() if c["type"] == "layers" and c["containers"] == [f"dra.{package}"]]
    assert len(found) == 1, f"dra.{package}: no layers contract of its own in pyproject.toml"
    return found[0]


def _table() -> list[tuple[int, str, str]]:
    """docs/architecture.md's layer table: (layer, package, the row's text)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `dra/(\w+)(?:\.py|/)?` \|(.*)\|$", text, re.MULTILINE)
    return [(int(layer), package, row) for layer, package, row in rows]


@pytest.mark.parametrize("package", _packages())
def test_every_package_has_an_exhaustive_layer_contract_and_states_its_rule(package: str) -> None:
    assert _inner(package)["exhaustive"] is True
    docstring = importlib.import_module(f"dra.{package}").__doc__ or ""
    assert "Rule:" in docstring, f"dra/{package}/__init__.py states no rule"


def test_the_architecture_table_is_the_contracts() -> None:
    (top,) = (c for c in _contracts() if c["type"] == "layers" and c["containers"] == ["dra"])
    table = _table()
    by_layer: dict[int, set[str]] = {}
    for layer, package, _ in table:
        by_layer.setdefault(layer, set()).add(package)
    assert [by_layer[n] for n in sorted(by_layer)] == [set(layer) for layer in _layers(top)]
    for _, package, row in table:
        if package in _packages():
            order = " over ".join(
                ", ".join(f"`{name}`" for name in layer) for layer in _layers(_inner(package))
            )
            assert f"inside: {order}" in row, f"dra/{package}'s row should say: inside: {order}"


def test_a_module_without_a_layer_or_a_fake_imported_outside_its_fence_breaks_lint(tmp_path: Path) -> None:
    # A copy of the package with a module planted in every package, each importing the fakes:
    # every layers contract (exhaustive) and the fakes' fence must break.
    shutil.copytree(ROOT / "dra", tmp_path / "dra", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for package in [*_packages(), "."]:
        (tmp_path / "dra" / package / "planted.py").write_text("import dra.fakegpus.profiles\n")
    result = subprocess.run(
        [Path(sys.executable).parent / "lint-imports", "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = " ".join(result.stdout.split())
    fence = "The fake GPUs are a user feature fenced off: imported only where --fake-gpus is handled"
    expected = [c["name"] for c in _contracts() if c["type"] == "layers" or c["name"] == fence]
    assert fence in expected
    assert [name for name in expected if f"{name} BROKEN" not in report] == []


def test_a_node_with_real_gpus_never_loads_the_fakes() -> None:
    # Every module of dra but the fakes, and the flags of each daemon without --fake-gpus: the
    # contract fences who may import dra.fakegpus, this shows those imports stay in their branch.
    script = textwrap.dedent(
        """
        import importlib, pathlib, sys
        import dra
        from dra.cli.parser import parse_args
        root = pathlib.Path(dra.__file__).parent
        for path in sorted(root.rglob("*.py")):
            name = ".".join(("dra", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
            if not name.startswith(("dra.fakegpus", "dra.__main__")):
                importlib.import_module(name)
        for command in ("kubelet-plugin", "device-plugin", "node-labeller"):
            parse_args([command, "--node-name", "n"])
        print(sorted(name for name in sys.modules if name.startswith("dra.fakegpus")))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


#: Modules a contract fences (protected): a package may import them only if it is an allowed importer.
def _fenced() -> dict[str, list[str]]:
    return {
        module.removeprefix("dra."): contract["allowed_importers"]
        for contract in _contracts()
        if contract["type"] == "protected"
        for module in contract["protected_modules"]
        if module.startswith("dra.")
    }


def _permitted(package: str) -> tuple[set[str], set[str]]:
    """What the contracts let dra.<package> import of dra: (every layer below it, what it may import)."""
    (top,) = (c for c in _contracts() if c["type"] == "layers" and c["containers"] == ["dra"])
    layers = _layers(top)
    (mine,) = (n for n, layer in enumerate(layers) if package in layer)
    below = {name for layer in layers[mine + 1 :] for name in layer}
    fenced = _fenced()
    permitted = {
        name
        for name in below
        if name not in fenced or any(a.split(".")[:2] == ["dra", package] for a in fenced[name])
    }
    for contract in _contracts():
        if contract["type"] == "forbidden" and f"dra.{package}" in contract["source_modules"]:
            permitted -= {m.removeprefix("dra.") for m in contract["forbidden_modules"]}
    return {name for name in below if name not in fenced}, permitted


@pytest.mark.parametrize("package", _packages())
def test_every_package_docstring_names_what_the_contracts_let_it_import(package: str) -> None:
    # A rule says "imports every layer below" (naming the fenced modules it may import too) or
    # "imports only" and names each: ``dra.api``. Either way the names are the contracts' own.
    rule = (importlib.import_module(f"dra.{package}").__doc__ or "").partition("Rule:")[2]
    rule = " ".join(rule.split()).lower()
    named = set(re.findall(r"``dra\.(\w+)``", rule))
    unfenced, permitted = _permitted(package)
    if "imports every layer below" in rule:
        assert unfenced <= permitted, f"dra/{package}: a contract forbids part of a layer below"
        assert named == permitted - unfenced, (
            f"dra/{package}'s rule should name the fenced: {permitted - unfenced}"
        )
    elif permitted:
        assert "imports only" in rule, (
            f"dra/{package}'s rule says neither 'imports every layer below' nor 'imports only'"
        )
        assert named == permitted, f"dra/{package}'s rule should name exactly {sorted(permitted)}"
    else:
        assert "imports nothing of dra" in rule, f"dra/{package}'s rule should say it imports nothing of dra"


def test_the_package_docstring_names_every_layer_bottom_up() -> None:
    (top,) = (c for c in _contracts() if c["type"] == "layers" and c["containers"] == ["dra"])
    headings = re.findall(r"^``(\w+)``", importlib.import_module("dra").__doc__ or "", re.MULTILINE)
    expected = [name for layer in reversed(_layers(top)) for name in layer if name != "pb"]
    assert headings == [name for name in expected if name in headings]
    assert set(expected) <= set(re.findall(r"``(\w+)``", importlib.import_module("dra").__doc__ or ""))


def test_every_module_of_the_package_and_of_the_local_tooling_stays_under_500_lines() -> None:
    # One concern a module (docs/architecture.md); the generated gRPC code aside.
    modules = [
        path
        for tree in (ROOT / "dra", ROOT / "deploy" / "local")
        for path in tree.rglob("*.py")
        if "pb" not in path.relative_to(ROOT).parts[:2]
    ]
    assert len(modules) > 100
    long = {
        str(path.relative_to(ROOT)): n for path in modules if (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
