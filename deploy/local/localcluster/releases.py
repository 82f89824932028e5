"""The releases, found in the repository's history: a release is the commit that sets a new version.

    python -m localcluster.releases              # list them, newest first (make releases)
    python -m localcluster.releases --previous   # the one this tree's upgrade test starts from

The version lives in one place, ``__version__`` in dra/__init__.py (docs/releases.md). A commit
whose version differs from its first parent's, and was never set before, is the release of that
version. ``git log -G`` on that line finds them in any clone with the history; tags are not
needed (they reach a clone only where someone pushed them). Before the line existed, every
commit said 0.1.0 in pyproject.toml, so the history cannot tell which commit was released:
RECORDED names that release. A shallow clone lacks the history, and is refused with the command
that fetches it rather than answered with a partial list.

Only the standard library: ``make releases`` runs on a fresh clone with the system Python.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: The one place: the file and its line.
VERSION_FILE = "dra/__init__.py"
VERSION_LINE = re.compile(r'^__version__ = "(?P<version>[^"\n]*)"$', re.MULTILINE)
#: The chart, whose version and appVersion follow the one place (`make manifests` writes them).
CHART = "deploy/helm/dra-gpu"
#: Where the version was before it had one place (a static [project] version).
OLD_VERSION_FILE = "pyproject.toml"
OLD_VERSION_LINE = re.compile(r'^version = "(?P<version>[^"\n]*)"$', re.MULTILINE)
#: MAJOR.MINOR.PATCH: a SemVer that helm takes for the chart and a PEP 440 version pip takes alike.
VERSION = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})")


class ReleaseError(RuntimeError):
    """The history cannot answer: not a clone, a shallow one, or a version that is not X.Y.Z."""


@dataclass(frozen=True)
class Release:
    """A release: its version, the commit that set it, that commit's date (YYYY-MM-DD)."""

    version: str
    commit: str
    date: str
    #: Made before the version had one place, so named in RECORDED rather than found.
    recorded: bool = False


#: The release made before the version had its one place: main at the end of the third round
#: (2026-11-26), the last tree before the chart first ran on a cluster, and the one the chart's
#: upgrade test started from while no later release existed.
RECORDED = (Release("0.1.0", "d9b8ac168f234d8a557581314ceb3734ce227909", "2026-11-26", recorded=True),)


def version_key(version: str) -> tuple[int, int, int]:
    """The version's order; ReleaseError for a version that is not MAJOR.MINOR.PATCH."""
    found = VERSION.fullmatch(version)
    if found is None:
        raise ReleaseError(f"version {version!r} is not MAJOR.MINOR.PATCH (digits, no leading zeros)")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def version_in(read: Callable[[str], str | None]) -> str | None:
    """The version a tree says, given a reader of its files (None for a file it lacks): the one
    place's, else pyproject.toml's static one of a tree from before it, else None."""
    for name, line in ((VERSION_FILE, VERSION_LINE), (OLD_VERSION_FILE, OLD_VERSION_LINE)):
        text = read(name)
        found = line.search(text) if text is not None else None
        if found is not None:
            return found["version"]
    return None


def tree_version(root: Path = ROOT) -> str:
    """The version of the tree at `root` (a checkout, or a build context holding the one place)."""

    def read(name: str) -> str | None:
        path = root / name
        return path.read_text() if path.is_file() else None

    found = version_in(read)
    if found is None:
        raise ReleaseError(f"{root} holds no version: {VERSION_FILE} has no __version__ line")
    return found


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def commit_version(commit: str, root: Path = ROOT) -> str | None:
    """The version a commit's tree says (None where it says none)."""

    def read(name: str) -> str | None:
        shown = _git(root, "show", f"{commit}:{name}", check=False)
        return shown.stdout if shown.returncode == 0 else None

    return version_in(read)


def check_history(root: Path = ROOT) -> None:
    """ReleaseError unless `root` is a git clone with its whole history."""
    shallow = _git(root, "rev-parse", "--is-shallow-repository", check=False)
    if shallow.returncode != 0:
        raise ReleaseError(f"{root} is not a git clone: the releases are found in its history")
    if shallow.stdout.strip() == "true":
        raise ReleaseError(
            f"{root} is a shallow clone: its history may lack releases. Fetch the rest with "
            f"`git -C {root} fetch --unshallow` (or clone without --depth) and run again"
        )


def releases(root: Path = ROOT, rev: str = "HEAD") -> list[Release]:
    """Every release in `rev`'s history, newest version first."""
    check_history(root)
    # Oldest first, so that a version set again later (a revert, a merge) keeps its first commit;
    # merges are compared with their first parent, where a branch's version arrives on main.
    log = _git(
        root,
        "log",
        "--topo-order",
        "--reverse",
        "--diff-merges=first-parent",
        "--no-patch",
        "--format=%H %P %cs",
        # git's own regular expressions: the line, whatever its value
        "-G",
        "^__version__ = ",
        rev,
        "--",
        VERSION_FILE,
    )
    found: dict[str, Release] = {}
    for line in log.stdout.splitlines():
        commit, *parents, date = line.split()
        version = commit_version(commit, root)
        before = commit_version(parents[0], root) if parents else None
        if version is None or version == before or version in found:
            continue
        version_key(version)
        found[version] = Release(version, commit, date)
    for recorded in RECORDED:
        reached = _git(root, "merge-base", "--is-ancestor", recorded.commit, rev, check=False)
        if recorded.version not in found and reached.returncode == 0:
            found[recorded.version] = recorded
    return sorted(found.values(), key=lambda r: version_key(r.version), reverse=True)


def release_at(root: Path = ROOT, rev: str = "HEAD") -> Release | None:
    """The release whose commit `rev` is, or None."""
    commit = _git(root, "rev-parse", f"{rev}^{{commit}}").stdout.strip()
    return next((r for r in releases(root, rev) if r.commit == commit), None)


def shipped() -> tuple[str, ...]:
    """The paths of the tree an upgrade replaces: the image's build context and the chart."""
    # Imported here: driverimage reads its versions through this module.
    from localcluster.driverimage import CONTEXT

    return (*CONTEXT, CHART)


def previous_release(root: Path = ROOT) -> Release:
    """The newest release whose shipped files differ from this working tree's: the one to upgrade from.

    At a release's own commit, or after it with changes elsewhere only (docs), the tree ships
    what that release shipped, so the one before it is the one to upgrade from.
    """
    paths = shipped()
    for release in releases(root):
        same = _git(root, "diff", "--quiet", release.commit, "--", *paths, check=False)
        if same.returncode == 1:
            return release
        if same.returncode != 0:
            raise ReleaseError(f"git diff {release.commit} failed: {same.stderr.strip()}")
    raise ReleaseError(f"no release before this tree in {root}'s history to upgrade from")


def _describe(release: Release, current: str) -> str:
    notes = []
    if release.version == current:
        notes.append("this tree's version")
    if release.recorded:
        notes.append("recorded: from before the version had one place")
    return f"{release.version:<9} {release.commit[:12]}  {release.date}  {', '.join(notes)}".rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; the exit status (1 with one line on stderr when the history cannot answer)."""
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.releases", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--previous",
        action="store_true",
        help="print the release the chart's upgrade test starts from for this tree",
    )
    args = parser.parse_args(argv)
    try:
        if args.previous:
            found = previous_release(ROOT)
            print(f"{found.version} {found.commit}")
            return 0
        current = tree_version(ROOT)
        listed = releases(ROOT)
        print(f"{'version':<9} {'commit':<12}  {'date':<10}")
        for release in listed:
            print(_describe(release, current))
    except ReleaseError as err:
        print(f"releases: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
