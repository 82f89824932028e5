"""Coverage-guided fuzzing (atheris, libFuzzer for Python) of every ``tests/fuzz/fuzz_*.py`` target.

A target is a module ``tests/fuzz/fuzz_<name>.py`` that defines ``TestOneInput(data: bytes)``:
it must return for every input, raising only on a bug. Its seed corpus, if any, is
``tests/fuzz/corpus/<name>/`` (one input per file). Each target runs in a child process of
its own (libFuzzer exits when it is done), with the ``dra`` package instrumented for coverage::

    .venv/bin/python -m tests.fuzz.run [--seconds 60] [--keep] [TARGET ...]

``--seconds`` is per target (``make fuzz``: FUZZ_SECONDS). The committed corpus is only
read. New inputs go to a temporary directory, so that a run inside ``make test`` writes
nothing into the checkout; with ``--keep`` (``make fuzz``) to ``.fuzz/<name>/corpus/``,
where the next run goes on from them. An input that raises, runs longer than
``--input-timeout`` seconds or takes more than ``--rss-mb`` MiB is saved as
``.fuzz/<name>/crash-*`` (``.fuzz`` is ignored by git) and the run fails; replay one with
``.venv/bin/python -m tests.fuzz.run --replay FILE TARGET``, fix it, and commit it to the
corpus as ``finding-<what>`` so that every later run replays it.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARTIFACTS = ROOT / ".fuzz"


@dataclass(frozen=True)
class Result:
    """One target's run: its name, exit status, seconds and the tail of libFuzzer's output."""

    target: str
    returncode: int
    seconds: float
    output: str

    @property
    def ok(self) -> bool:
        """libFuzzer found nothing."""
        return self.returncode == 0


def targets() -> list[str]:
    """Every target's name (``fuzz_cel.py`` is ``cel``), sorted."""
    return sorted(path.stem.removeprefix("fuzz_") for path in HERE.glob("fuzz_*.py"))


def corpus_dir(target: str) -> Path:
    """The committed seed corpus of ``target`` (which may not exist)."""
    return HERE / "corpus" / target


def run(
    target: str, seconds: int, *, keep: bool = False, input_timeout: int = 5, rss_mb: int = 768
) -> Result:
    """Fuzz one target for ``seconds`` in a child process."""
    artifacts = ARTIFACTS / target
    artifacts.mkdir(parents=True, exist_ok=True)
    seeds = corpus_dir(target)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as scratch:
        # libFuzzer writes new inputs into its first corpus directory and only reads the others.
        work = artifacts / "corpus" if keep else Path(scratch)
        work.mkdir(exist_ok=True)
        corpora = [work, *([seeds] if seeds.is_dir() else [])]
        argv = [
            sys.executable,
            "-m",
            "tests.fuzz.run",
            "--child",
            target,
            f"-max_total_time={seconds}",
            f"-timeout={input_timeout}",
            f"-rss_limit_mb={rss_mb}",
            f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1",
            *map(str, corpora),
        ]
        child = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120, check=False
        )
    output = (child.stdout + child.stderr)[-6000:]
    return Result(target, child.returncode, time.monotonic() - start, output)


def _child(target: str, libfuzzer_args: list[str]) -> None:
    import atheris  # only the child needs it; the parent stays importable without it

    with atheris.instrument_imports(include=["dra"]):
        module = importlib.import_module(f"tests.fuzz.fuzz_{target}")
    atheris.Setup([sys.argv[0], *libfuzzer_args], module.TestOneInput)
    atheris.Fuzz()


def _replay(target: str, path: Path) -> None:
    module = importlib.import_module(f"tests.fuzz.fuzz_{target}")
    module.TestOneInput(path.read_bytes())
    print(f"{path}: no failure")


def main() -> int:
    """Fuzz the named targets (default: all) one after the other; 1 if any found something."""
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="TARGET", help=f"default: all of {', '.join(targets())}")
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--keep", action="store_true", help="keep new inputs in .fuzz/<target>/corpus/")
    parser.add_argument("--input-timeout", type=int, default=5, help="seconds one input may take")
    parser.add_argument("--rss-mb", type=int, default=768, help="memory one process may take")
    parser.add_argument("--replay", type=Path, help="run one saved input through TARGET, without libFuzzer")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(targets()))
    if unknown:
        parser.error(f"no target {', '.join(unknown)} (have {', '.join(targets())})")
    if args.replay:
        if len(args.names) != 1:
            parser.error("--replay needs exactly one TARGET")
        _replay(args.names[0], args.replay)
        return 0
    failed = False
    for name in args.names or targets():
        result = run(name, args.seconds, keep=args.keep, input_timeout=args.input_timeout, rss_mb=args.rss_mb)
        stats = [line for line in result.output.splitlines() if line.startswith(("stat::", "#", "Done"))]
        print(f"{name}: {'ok' if result.ok else 'FOUND A FAILURE'} in {result.seconds:.0f} s")
        print("  " + "\n  ".join(stats[-4:]))
        if not result.ok:
            failed = True
            print(result.output)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
