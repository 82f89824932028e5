"""Hostile CEL inputs (issue 26), each run in a child process under CPU, memory and wall-clock limits.

The regression tests (tests/unit/cel/test_hostile.py) and the before/after figures in
docs/architecture.md use the same cases::

    PYTHONPATH=deploy/local .venv/bin/python -m tests.hostile [--cpu-limit 60] [CASE ...]

A child that runs past its limits is killed, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

DRIVER = "gpu.nvidia.com"
ATTR = f'device.attributes["{DRIVER}"]'
# Address space, not RSS: the explain command maps shared libraries (TLS, and the kubernetes
# client for some kubeconfigs), so this is a guard against a memory bomb; RSS is measured and
# compared with 200 MB apart.
ADDRESS_SPACE_LIMIT = 1 << 30


@dataclass(frozen=True)
class Outcome:
    """What a child did: exit status, output, CPU seconds, peak RSS and wall time."""

    returncode: int
    stdout: str
    stderr: str
    cpu_s: float
    max_rss_mb: float
    wall_s: float

    @property
    def summary(self) -> str:
        """The last line the child printed (stderr first), for reports."""
        lines = (self.stderr or self.stdout).strip().splitlines()
        return lines[-1][:150] if lines else f"exit {self.returncode}"


def _limits(cpu_s: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    return apply


def run_limited(argv: list[str], *, cpu_s: int = 3, wall_s: float = 60.0) -> Outcome:
    """Run ``argv`` with at most ``cpu_s`` CPU seconds, 1 GiB of address space and ``wall_s`` seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_limits(cpu_s)
    ) as child:
        try:
            stdout, stderr = child.communicate(timeout=wall_s)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
    wall = time.monotonic() - start
    # Children's usage as a delta; the peak RSS is the largest of any child so far, which
    # run_case replaces with the child's own figure whenever the child lived to report it.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Outcome(child.returncode, stdout, stderr, cpu, after.ru_maxrss / 1024, wall)


def _python(code: str) -> list[str]:
    # The case reports its own CPU time and peak RSS on the last line of stdout.
    report = (
        "import resource as _r; _u = _r.getrusage(_r.RUSAGE_SELF); "
        "print(f'@usage {_u.ru_utime + _u.ru_stime} {_u.ru_maxrss}')"
    )
    return [sys.executable, "-c", f"try:\n{_indent(code)}\nfinally:\n    {report}"]


def _indent(code: str) -> str:
    return "\n".join("    " + line for line in code.splitlines())


def _claim_file(directory: Path, *selectors: str) -> Path:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "hostile", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "selectors": [{"cel": {"expression": s}} for s in selectors],
                        },
                    }
                ]
            }
        },
    }
    path = directory / "claim.yaml"
    path.write_text(yaml.safe_dump(claim))
    return path


def _explain(claim: Path) -> list[str]:
    code = (
        "import sys\nfrom dra.cli import main\n"
        f"code = main(['explain', '--fake-gpus', 'h100x8', '--claim', {str(claim)!r}])\n"
        "sys.stdout.flush()"
    )
    return _python(code)


def _evaluate(expression_code: str) -> list[str]:
    code = (
        "from dra.cel import CelError, compile_expression\n"
        f"expression = {expression_code}\n"
        "try:\n"
        "    print('result:', compile_expression(expression).evaluate())\n"
        "except CelError as err:\n"
        "    print('error:', str(err).splitlines()[0])"
    )
    return _python(code)


def _parse(call: str, error: str) -> list[str]:
    code = f"from dra.cel import {error}, {call.split('.')[0]}\ntry:\n    {call}\nexcept {error} as err:\n"
    code += "    print('error:', err)"
    return _python(code)


def _nested_binds(levels: int = 9, fan_out: int = 10) -> str:
    # Each level joins the previous level's string `fan_out` times: 10**levels characters at the end.
    body = f"size(s{levels}) > 0"
    for level in range(levels, 0, -1):
        joined = ", ".join([f"s{level - 1}"] * fan_out)
        body = f'cel.bind(s{level}, [{joined}].join(""), {body})'
    return f'cel.bind(s0, "x", {body})'


def _near_limit_selector(index: int) -> str:
    # Three nested loops, about 800,000 node evaluations: just under the old step limit of 1,000,000.
    a = "[" + ", ".join(str(i) for i in range(100)) + "]"
    b = "[" + ", ".join(str(i) for i in range(15)) + "]"
    return f"{a}.all(x, {a}.all(y, {b}.all(z, z + {index} >= 0)))"


def cases(directory: Path) -> dict[str, list[str]]:
    """The reproducers of issue 26 by name: the argv of a child process for each."""
    catastrophic = "^(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*$x"
    regex_dir = directory / "regex"
    selectors_dir = directory / "selectors"
    regex_dir.mkdir(exist_ok=True)
    selectors_dir.mkdir(exist_ok=True)
    return {
        "regex-explain": _explain(_claim_file(regex_dir, f'{ATTR}.productName.matches("{catastrophic}")')),
        "regex-literal": _evaluate(repr('"' + "a" * 32 + '!".matches("^(a+)+$")')),
        "nested-binds": _evaluate(repr(_nested_binds())),
        "twenty-selectors": _explain(
            _claim_file(selectors_dir, *(_near_limit_selector(i) for i in range(20)))
        ),
        "ten-megabytes": _evaluate("'1 == 1 && ' * 1_048_576 + 'true'"),
        "long-int-literal": _evaluate("'9' * 4301 + ' > 0'"),
        "long-semver": _parse("Semver.parse('1.2.' + '9' * 4301)", "SemverError"),
        "long-quantity": _parse("Quantity.parse('9' * 4301)", "QuantityError"),
        # The opaque-config path, where the ValueError became a webhook 500 and a prepare "internal error".
        "long-quantity-config": _python(
            "from dra.api.fields import FieldError\nfrom dra.api.opaque import decode\n"
            "mps = {'defaultPinnedDeviceMemoryLimit': '9' * 4301}\n"
            "config = {'apiVersion': 'resource.nvidia.com/v1beta1', 'kind': 'GpuConfig',\n"
            "          'sharing': {'strategy': 'MPS', 'mpsConfig': mps}}\n"
            "try:\n    decode(config)\nexcept FieldError as err:\n    print('error:', err)"
        ),
    }


def run_case(argv: list[str], *, cpu_s: int = 3, wall_s: float = 60.0) -> Outcome:
    """Run one case; CPU seconds and peak RSS come from the child's own report when it got to print it."""
    outcome = run_limited(argv, cpu_s=cpu_s, wall_s=wall_s)
    lines = outcome.stdout.splitlines()
    if lines and lines[-1].startswith("@usage "):
        _, cpu, rss = lines[-1].split()
        stdout = "\n".join(lines[:-1])
        rss_mb = int(rss) / 1024
        return Outcome(outcome.returncode, stdout, outcome.stderr, float(cpu), rss_mb, outcome.wall_s)
    return outcome


def main() -> None:
    """Print one table row per case: time, peak RSS and what it printed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--cpu-limit", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in cases(Path(tmp)).items():
            if args.names and name not in args.names:
                continue
            outcome = run_case(argv, cpu_s=args.cpu_limit, wall_s=args.cpu_limit * 3)
            killed = "" if outcome.returncode >= 0 else f" (killed by signal {-outcome.returncode})"
            print(
                f"| {name} | {outcome.wall_s:.1f} s wall, {outcome.cpu_s:.1f} s CPU | "
                f"{outcome.max_rss_mb:.0f} MB | {outcome.summary}{killed} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
