"""Benchmark: dra.cel against cel-expr-python (Google's C++ CEL runtime), the figures behind
"CEL: why our own evaluator" in docs/architecture.md.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_cel [--devices 1000] [--runs 15]

Speed: one 4-clause selector over N published devices, fastest of the runs, end to end
(from the slice's device objects to a verdict per device) and evaluation alone. Coverage:
the selectors of docs/cel-cookbook.md, each run by tests/e2e/test_cookbook.py on the real
scheduler, whose verdicts dra.cel reproduces there; a selector counts as covered by the
oracle where it compiles and gives dra.cel's verdict on every device of the cookbook's fake
node. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from dra.cel import compile_expression
from dra.cel.device import device_variable
from dra.core.slices import build_slices
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from tests.celgen import devices
from tests.celoracle import Oracle, dra_verdict, oracle_device
from tests.e2e.cookbook import load_cases

DRIVER = "gpu.nvidia.com"
ATTR = f'device.attributes["{DRIVER}"]'
FOUR_CLAUSES = (
    f'{ATTR}.type == "gpu" && {ATTR}.productName.matches("^NVIDIA (H100|L40S)") '
    f'&& {ATTR}.index >= 1 && {ATTR}.architecture in ["Hopper", "Ada Lovelace"]'
)
# Regex matching alone: a partial match that succeeds, one that fails after scanning the whole
# name, and a case-insensitive alternation, over every device's product name.
MATCHES = (
    f'{ATTR}.productName.matches("H100") && !{ATTR}.productName.matches("[0-9]{{4}}$") '
    f'&& {ATTR}.productName.matches("(?i)^nvidia (h|a)[0-9]+")'
)
COOKBOOK_PROFILE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "cookbook-profile.yaml"

Obj = dict[str, Any]


def _fastest_ms(run: Callable[[], object], runs: int) -> float:
    # The fastest run is the one least disturbed by whatever else the machine was doing.
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000)
    return min(samples)


def _fleet(count: int) -> list[Obj]:
    """``count`` devices, cycling through those of the differential tests' three profiles."""
    base = devices(DRIVER)
    return [{**base[i % len(base)], "name": f"d{i}"} for i in range(count)]


def _speed(count: int, runs: int) -> None:
    fleet = _fleet(count)
    oracle = Oracle()
    program = compile_expression(FOUR_CLAUSES)
    compiled = oracle.compile(FOUR_CLAUSES)

    def ours_end_to_end() -> list[object]:
        return [program.run_selector(device, DRIVER) for device in fleet]

    def theirs_end_to_end() -> list[object]:
        return [compiled.eval(data={"device": oracle_device(device, DRIVER)}).value() for device in fleet]

    variables = [{"device": device_variable(device, DRIVER)} for device in fleet]
    data = [{"device": oracle_device(device, DRIVER)} for device in fleet]

    def ours_eval() -> list[object]:
        return [program.run(v) for v in variables]

    def theirs_eval() -> list[object]:
        return [compiled.eval(data=d).value() for d in data]

    agree = sum(
        dra_verdict(FOUR_CLAUSES, device, DRIVER) == oracle.verdict(FOUR_CLAUSES, d["device"])
        for device, d in zip(fleet, data, strict=True)
    )
    matching = sum(r is True for r in ours_end_to_end())
    print(f"one 4-clause selector over {count} devices ({matching} match), fastest of {runs} runs:")
    print(f"  {FOUR_CLAUSES}")
    matcher = compile_expression(MATCHES)
    matcher_oracle = oracle.compile(MATCHES)
    rows = [
        ("end to end", _fastest_ms(ours_end_to_end, runs), _fastest_ms(theirs_end_to_end, runs)),
        ("evaluation only", _fastest_ms(ours_eval, runs), _fastest_ms(theirs_eval, runs)),
        (
            "3 regex matches",
            _fastest_ms(lambda: [matcher.run(v) for v in variables], runs),
            _fastest_ms(lambda: [matcher_oracle.eval(data=d).value() for d in data], runs),
        ),
    ]
    print(f"  {'':18}{'dra.cel':>10}{'cel-expr-python':>18}{'ratio':>8}")
    for label, ours, theirs in rows:
        print(f"  {label:18}{ours:>8.1f}ms{theirs:>16.1f}ms{ours / theirs:>7.1f}x")
    print(f"  verdicts agree on {agree}/{count} devices")
    print(f"  the regex row: {MATCHES}")


def cookbook_selectors() -> list[str]:
    """Every distinct CEL selector of docs/cel-cookbook.md (classes and requests), in page order."""
    found: list[str] = []
    for case in load_cases():
        for obj in case.objects:
            spec = obj["spec"]
            selectors = list(spec.get("selectors") or [])
            if obj["kind"] == "ResourceClaimTemplate":
                for request in spec["spec"]["devices"]["requests"]:
                    for part in [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]:
                        selectors += part.get("selectors") or []
            for selector in selectors:
                if selector["cel"]["expression"] not in found:
                    found.append(selector["cel"]["expression"])
    return found


def _coverage() -> None:
    inventory = discover(FakeGpuLibrary(load_profile(str(COOKBOOK_PROFILE)), "node"))
    node_devices = build_slices(inventory, DRIVER, "node", None, 1)[0]["spec"]["devices"]
    oracle = Oracle()
    selectors = cookbook_selectors()
    covered = 0
    where = f"docs/cel-cookbook.md on its {len(node_devices)} devices"
    print(f"\ncoverage: the {len(selectors)} selectors of {where}")
    for expression in selectors:
        ours = [dra_verdict(expression, device, DRIVER) for device in node_devices]
        theirs = [oracle.verdict(expression, oracle_device(device, DRIVER)) for device in node_devices]
        if oracle.compile(expression) is None:
            why = "does not compile"
        elif ours != theirs:
            wrong = sum(a != b for a, b in zip(ours, theirs, strict=True))
            why = f"{wrong} device verdict(s) differ"
        else:
            why = "same verdicts"
            covered += 1
        print(f"  {why:26} {expression[:90]}")
    print(f"  dra.cel {len(selectors)}/{len(selectors)} (the reference: tests/e2e/test_cookbook.py)")
    print(f"  cel-expr-python {covered}/{len(selectors)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"cel-expr-python {metadata.version('cel-expr-python')}, {time.strftime('%Y-%m-%d')}"
    )
    _speed(args.devices, args.runs)
    _coverage()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
