"""The fuzz targets of tests/fuzz run clean over their seed corpora (the fuzzer starts from these)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

FUZZ = Path(__file__).parent.parent / "fuzz"


def _target(name: str) -> Callable[[bytes], None]:
    spec = importlib.util.spec_from_file_location(name, FUZZ / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target: Callable[[bytes], None] = module.TestOneInput
    return target


@pytest.mark.parametrize(
    ("target", "corpus"),
    [
        ("fuzz_webhook", "webhook"),
        ("fuzz_config", "config"),
        ("fuzz_argv", "argv"),
        ("fuzz_certificates", "certificates"),
        ("fuzz_statefiles", "statefiles"),
    ],
)
def test_every_seed_runs_through_its_target(target: str, corpus: str) -> None:
    run = _target(target)
    seeds = sorted((FUZZ / "corpus" / corpus).iterdir())
    assert len(seeds) >= 5
    for seed in seeds:
        run(seed.read_bytes())
    # Mutations a fuzzer finds first: truncations and single flipped bytes.
    for seed in seeds:
        data = seed.read_bytes()
        for cut in range(0, len(data), max(1, len(data) // 16)):
            run(data[:cut])
            run(data[:cut] + bytes([data[cut] ^ 0x20]) + data[cut + 1 :])
