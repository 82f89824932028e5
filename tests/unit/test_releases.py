"""Releases found in a repository's history (localcluster.releases) and `make release`'s refusals
and image naming (localcluster.dist), on small repositories made with git here."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from localcluster import dist, images, releases

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "PATH": "/usr/bin:/bin",
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=GIT_ENV
    )
    return done.stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str] | None = None) -> str:
    """Write files and commit them; the commit's hash."""
    for name, text in (files or {}).items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


INIT = releases.VERSION_FILE


def one_place(version: str) -> str:
    return f'"""The package."""\n\n__version__ = "{version}"\n'


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A history like this project's: 0.1.0 in pyproject.toml, then the one place, then 0.2.0."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    commit(path, "start", {"pyproject.toml": '[project]\nversion = "0.1.0"\n', "dra/x.py": "a = 1\n"})
    commit(path, "work", {"dra/x.py": "a = 2\n"})
    commit(path, "one place, same version", {"pyproject.toml": "[project]\n", INIT: one_place("0.1.0")})
    commit(path, "release 0.2.0", {INIT: one_place("0.2.0")})
    return path


def versions(found: list[releases.Release]) -> list[str]:
    return [r.version for r in found]


def test_a_release_is_the_commit_that_sets_a_new_version(repo: Path) -> None:
    [release] = releases.releases(repo)
    assert (release.version, release.commit) == ("0.2.0", git(repo, "rev-parse", "HEAD"))
    assert not release.recorded
    assert releases.tree_version(repo) == "0.2.0"
    # Moving the version to its one place did not make a release: 0.1.0 is what pyproject said.
    assert releases.commit_version("HEAD~2", repo) == releases.commit_version("HEAD~3", repo) == "0.1.0"


def test_the_recorded_release_joins_the_found_ones_when_the_history_holds_it(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = git(repo, "rev-parse", "HEAD~2")
    monkeypatch.setattr(releases, "RECORDED", (releases.Release("0.1.0", work, "2026-11-26", recorded=True),))
    assert versions(releases.releases(repo)) == ["0.2.0", "0.1.0"]
    monkeypatch.setattr(releases, "RECORDED", (releases.Release("0.1.0", "0" * 40, "2026-11-26", True),))
    assert versions(releases.releases(repo)) == ["0.2.0"], "a commit this history lacks is not listed"


def test_a_branchs_release_merged_is_found_once_and_a_version_set_again_is_no_new_release(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "next")
    bump = commit(repo, "release 0.3.0", {INIT: one_place("0.3.0")})
    git(repo, "checkout", "-q", "main")
    commit(repo, "other work on main", {"dra/x.py": "a = 3\n"})
    git(repo, "merge", "-q", "--no-ff", "-m", "merge next", "next")
    commit(repo, "back to 0.2.0 by mistake", {INIT: one_place("0.2.0")})
    commit(repo, "and 0.3.0 again", {INIT: one_place("0.3.0")})
    found = releases.releases(repo)
    assert versions(found) == ["0.3.0", "0.2.0"]
    assert found[0].commit == bump


def test_the_previous_release_is_the_newest_whose_shipped_files_differ(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(releases, "shipped", lambda: ("dra", "pyproject.toml"))
    first = git(repo, "rev-parse", "HEAD~2")
    monkeypatch.setattr(
        releases, "RECORDED", (releases.Release("0.1.0", first, "2026-11-26", recorded=True),)
    )
    # At 0.2.0's own commit, or after it with docs only: the tree ships 0.2.0, so 0.1.0 is before it.
    assert releases.previous_release(repo).version == "0.1.0"
    commit(repo, "docs", {"README.md": "words\n"})
    assert releases.previous_release(repo).version == "0.1.0"
    # A change not committed yet counts: the tree under test is the working tree.
    (repo / "dra" / "x.py").write_text("a = 4\n")
    assert releases.previous_release(repo).version == "0.2.0"
    commit(repo, "code")
    assert releases.previous_release(repo).version == "0.2.0"


def test_no_release_to_upgrade_from_is_an_error(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(releases, "shipped", lambda: ("dra",))
    with pytest.raises(releases.ReleaseError, match="no release before this tree"):
        releases.previous_release(repo)


def test_a_shallow_clone_is_refused_with_the_command_that_fetches_the_history(
    repo: Path, tmp_path: Path
) -> None:
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True, env=GIT_ENV
    )
    for call in (releases.releases, releases.previous_release, releases.release_at):
        with pytest.raises(releases.ReleaseError, match=r"shallow clone.*fetch --unshallow"):
            call(shallow)


def test_a_tree_that_is_no_clone_and_a_malformed_version_are_refused(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(releases.ReleaseError, match="is not a git clone"):
        releases.releases(tmp_path)
    commit(repo, "bad", {INIT: one_place("0.3")})
    with pytest.raises(releases.ReleaseError, match=r"'0.3' is not MAJOR.MINOR.PATCH"):
        releases.releases(repo)
    for bad in ("01.2.3", "1.2.3rc1", "v1.2.3", "1.2"):
        with pytest.raises(releases.ReleaseError):
            releases.version_key(bad)
    assert releases.version_key("10.0.1") > releases.version_key("9.10.11")


def test_make_releases_lists_them_newest_first(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(releases, "ROOT", repo)
    monkeypatch.setattr(releases, "RECORDED", ())
    commit(repo, "release 0.2.1", {INIT: one_place("0.2.1")})
    assert releases.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["version", "commit", "date"]
    assert [line.split()[0] for line in lines[1:]] == ["0.2.1", "0.2.0"]
    assert lines[1].endswith("this tree's version")


def test_make_release_refuses_a_dirty_tree_and_a_commit_that_is_no_release(repo: Path) -> None:
    dist.check_clean(repo)
    assert dist.check_at_release(repo).version == "0.2.0"
    (repo / "stray.txt").write_text("x")
    with pytest.raises(
        dist.RefusedError, match=r"1 changed or untracked path\(s\) \(first: \?\? stray.txt\)"
    ):
        dist.check_clean(repo)
    commit(repo, "after the release")
    with pytest.raises(dist.RefusedError, match=r"HEAD is not a release: its version 0.2.0 was released at"):
        dist.check_at_release(repo)


@pytest.mark.parametrize(
    ("reference", "resolved"),
    [
        ("dra-gpu:0.2.0", "docker.io/library/dra-gpu:0.2.0"),
        ("me/dra-gpu:0.2.0", "docker.io/me/dra-gpu:0.2.0"),
        ("registry.example.com/dra-gpu:0.2.0", "registry.example.com/dra-gpu:0.2.0"),
        ("localhost/dra-gpu:1.0.0", "localhost/dra-gpu:1.0.0"),
        ("host:5000/dra-gpu:1.0.0", "host:5000/dra-gpu:1.0.0"),
    ],
)
def test_image_references_resolve_as_the_kubelet_resolves_them(reference: str, resolved: str) -> None:
    assert dist.normalized(reference) == resolved


def test_a_renamed_image_tarball_keeps_every_blob(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hello").write_text("hi\n")
    built = tmp_path / "built.tar"
    images.write_oci_tarball(
        built, "dra-gpu.local/dra-gpu:0.2.0-abc", images.tree_layer(root), {"Cmd": ["x"]}
    )
    renamed = tmp_path / "renamed.tar"
    images.rename_oci_tarball(built, "docker.io/library/dra-gpu:0.2.0", renamed)
    assert images.image_name(built) == "dra-gpu.local/dra-gpu:0.2.0-abc"
    assert images.image_name(renamed) == "docker.io/library/dra-gpu:0.2.0"

    def contents(tarball: Path) -> dict[str, bytes]:
        with tarfile.open(tarball) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]

    before, after = contents(built), contents(renamed)
    assert before.keys() == after.keys()
    assert [n for n in before if before[n] != after[n]] == ["index.json"]
    [old], [new] = (json.loads(c["index.json"])["manifests"] for c in (before, after))
    assert old["digest"] == new["digest"]
