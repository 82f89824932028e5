"""The tests that cover the files changed since main, and a pytest run of them (`make test-changed`).

    .venv/bin/python -m tests.changed [--base main] [--cluster] [--list] [-- PYTEST ARGS]

A changed file is what `git diff` shows against the merge base of HEAD and `--base` (commits,
staged and unstaged changes) and every untracked file git does not ignore. Each maps to test
modules (docs/testing.md, "The tests of a change"):

- a Python module of `dra`, `tests`, `localcluster` or `fakenvml`: every test module that imports
  it, directly or through other modules (the import graph that import-linter checks, by grimp),
  or that imports a module of a package whose `__init__` it is. A test whose tooling runs the
  program as a process (`python -m dra ...`) or builds the driver's image from the package runs
  all of `dra.cli` without importing it, so it counts as importing `dra.cli`;
- any other file (or a module no test imports): the test modules importing a module of the tests
  or their tooling (not `dra`, which reads no file of the repository) whose source names it in
  quotes or between slashes, by its path, else its name, else the name of its
  directory, of that directory's parent and so on short of the top level (`"sharing.md"`,
  `/ "nvidia_specs"`);
- the files every run reads (EVERYWHERE), and a file nothing names: every test.

The tests that need no cluster run at once (in parallel, as `make test-fast`); the selected
cluster tests are listed, and run too with `--cluster`, or when nothing else covers the change.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
#: The import graph's packages and the directory each is imported from.
PACKAGES = {
    "dra": ROOT,
    "tests": ROOT,
    "localcluster": ROOT / "deploy" / "local",
    "fakenvml": ROOT / "deploy" / "local",
}
#: Files that decide how every test runs (dependencies, pytest's settings and fixtures, make's
#: targets): a change to one selects every test.
EVERYWHERE = frozenset({"pyproject.toml", "setup.py", "constraints.txt", "Makefile", "tests/conftest.py"})
#: Modules that name files without reading them: this selector and its test, as examples.
EXAMPLES = frozenset({"tests.changed", "tests.unit.test_changed"})
#: A module that runs the program in a process of its own (its argument list, over lines or not).
RUNS_THE_PROGRAM = re.compile(r'"-m",\s*"dra"')
#: The module that builds the driver's image, the whole package in it.
IMAGE_BUILDER = "localcluster.driverimage"
#: What either runs: the program, every command of it.
PROGRAM = "dra.cli"


def module_name(path: str) -> str | None:
    """The module a repository path is (dra/cli/__init__.py: dra.cli), or None."""
    if not path.endswith(".py"):
        return None
    parts = Path(path).with_suffix("").parts
    for package, directory in PACKAGES.items():
        prefix = (directory / package).relative_to(ROOT).parts
        if parts[: len(prefix)] == prefix:
            dotted = [package, *parts[len(prefix) :]]
            return ".".join(dotted[:-1] if dotted[-1] == "__init__" else dotted)
    return None


def _ancestors(module: str) -> list[str]:
    """dra.cli.options: dra.cli, dra (the packages whose __init__ importing it runs)."""
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def _is_test(module: str) -> bool:
    return module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")


def _path_of(module: str) -> str:
    """tests.unit.test_cli: tests/unit/test_cli.py."""
    return module.replace(".", "/") + ".py"


@dataclass
class Selection:
    """What a set of changed files selects: test modules, each with the changed files it is for."""

    tests: dict[str, set[str]] = field(default_factory=dict)
    #: Changed files nothing maps to a test: they select every test.
    unmapped: list[str] = field(default_factory=list)
    #: A changed file that selects every test (EVERYWHERE or unmapped).
    everything: bool = False

    def add(self, tests: Iterable[str], reason: str) -> bool:
        """Select `tests` for the changed file `reason`; whether there were any."""
        found = False
        for test in tests:
            self.tests.setdefault(test, set()).add(reason)
            found = True
        return found


class Graph:
    """The repository's import graph and its modules' sources."""

    def __init__(self) -> None:
        for directory in {str(d) for d in PACKAGES.values()}:
            if directory not in sys.path:
                sys.path.insert(0, directory)
        self.graph = grimp.build_graph(*PACKAGES, cache_dir=None)

    @cached_property
    def closures(self) -> dict[str, set[str]]:
        """Each test module: every module it runs on import, packages' __init__ included, and the
        program's when it runs the program as a process."""
        program = self._with_ancestors(self.graph.find_upstream_modules(PROGRAM) | {PROGRAM})
        runners = {
            m
            for m, text in self.sources.items()
            if m not in EXAMPLES and (m == IMAGE_BUILDER or RUNS_THE_PROGRAM.search(text))
        }
        closures = {}
        for test in filter(_is_test, self.graph.modules):
            closure = self._with_ancestors(self.graph.find_upstream_modules(test) | {test})
            closures[test] = closure | program if closure & runners else closure
        return closures

    @staticmethod
    def _with_ancestors(modules: set[str]) -> set[str]:
        return modules | {a for module in modules for a in _ancestors(module)}

    @cached_property
    def sources(self) -> dict[str, str]:
        """Each module's source text."""
        found = {}
        for module in self.graph.modules:
            for package, directory in PACKAGES.items():
                if module == package or module.startswith(package + "."):
                    base = directory / module.replace(".", "/")
                    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
                    found[module] = path.read_text(errors="replace")
        return found

    def importers(self, module: str) -> set[str]:
        """The test modules that run `module` when imported."""
        return {test for test, closure in self.closures.items() if module in closure}

    def naming(self, path: str) -> set[str]:
        """The test modules importing a module that names `path`: by path, else name, else directory."""
        parts = Path(path).parts
        # Its directories' names, nearest first, short of the top level ("docs" names no one file).
        keys = ["/".join(parts), parts[-1], *reversed(parts[1:-1])]
        for key in keys:
            quoted = re.compile(rf"(?<=[\"'/]){re.escape(key)}(?=[\"'/])")
            # The tests and their tooling: the package reads no file of the repository.
            modules = [
                m
                for m, text in self.sources.items()
                if not m.startswith("dra.") and m not in EXAMPLES and quoted.search(text)
            ]
            tests = set().union(*(self.importers(m) for m in modules))
            if tests:
                return tests
        return set()


def select(changed: Iterable[str], graph: Graph) -> Selection:
    """The test modules that cover the changed files (repository paths)."""
    selection = Selection()
    for path in sorted(set(changed)):
        if path in EVERYWHERE:
            selection.everything = True
            selection.add(graph.closures, path)
            continue
        module = module_name(path)
        if (
            module is not None
            and module in graph.graph.modules
            and selection.add(graph.importers(module), path)
        ):
            continue
        if not selection.add(graph.naming(path), path):
            selection.unmapped.append(path)
            selection.everything = True
    if selection.unmapped:
        selection.add(graph.closures, "(a file no test reads or imports)")
    return selection


def _git(root: Path, *args: str) -> list[str]:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return [line for line in done.stdout.splitlines() if line]


def changed_files(base: str, root: Path = ROOT) -> list[str]:
    """The files changed since the merge base of HEAD and `base`, committed or not, and untracked ones."""
    merge_base = _git(root, "merge-base", "HEAD", base)[0]
    return sorted(
        {
            *_git(root, "diff", "--name-only", merge_base),
            *_git(root, "ls-files", "--others", "--exclude-standard"),
        }
    )


def cluster_modules(tests: Iterable[str]) -> set[str]:
    """Those of `tests` with cluster tests, as pytest's collection marks them (tests/conftest.py)."""
    paths = [_path_of(t) for t in sorted(tests)]
    if not paths:
        return set()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "-p",
            "no:cacheprovider",
            "-m",
            "cluster",
            *paths,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    found = (line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line)
    return {path.removesuffix(".py").replace("/", ".") for path in found}


def command(selection: Selection, with_cluster: bool, pytest_args: Sequence[str]) -> list[str]:
    """The pytest command line that runs the selection, its cluster tests only `with_cluster`."""
    line = [sys.executable, "-m", "pytest", *pytest_args]
    if not with_cluster:
        line += ["-m", "not cluster"]
    if not selection.everything:
        line += [_path_of(t) for t in sorted(selection.tests)]
    return line


def main(argv: Sequence[str] | None = None) -> int:
    """Print what the change selects, then run it with pytest (or only print it: --list)."""
    parser = argparse.ArgumentParser(prog="python -m tests.changed", description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the branch the change is against (default main)")
    parser.add_argument("--cluster", action="store_true", help="run the selected cluster tests too")
    parser.add_argument("--list", action="store_true", help="print the selection and run nothing")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    changed = changed_files(args.base)
    if not changed:
        print(f"nothing changed since {args.base}: no test to run")
        return 0
    selection = select(changed, Graph())
    print(f"{len(changed)} files changed since {args.base}; {len(selection.tests)} test modules cover them")
    for path in selection.unmapped:
        print(f"  {path}: no test imports or names it, so every test runs")
    cluster = cluster_modules(selection.tests)
    # The cluster tests run when asked for, or when they alone cover the change.
    with_cluster = args.cluster or not set(selection.tests) - cluster
    if args.list:
        for test, why in sorted(selection.tests.items()):
            print(f"  {_path_of(test)}{' (cluster)' if test in cluster else ''}: {', '.join(sorted(why))}")
        return 0
    if cluster and not with_cluster:
        print(f"  not run: the cluster tests of {len(cluster)} of them (--cluster, or CLUSTER=1, runs them)")
    line = command(selection, with_cluster, args.pytest_args)
    print(" ".join(line[2:]), flush=True)
    return subprocess.run(line, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
