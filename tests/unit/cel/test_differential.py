"""dra.cel against cel-expr-python (Google's C++ CEL runtime) on generated selectors.

Every generated selector runs on every device the driver publishes for three fake
profiles; both evaluators must agree on match, no match or error.  A disagreement is a
bug in one of them: fix dra.cel (with a focused test beside this one), or record the
oracle's bug in KNOWN_DIFFERENCES below.

What the oracle is told so that it can play Kubernetes (see tests/celoracle.py): the
unknown-domain-as-empty-map default is handed to it as data, and it gets the strings
extension.  Quantities and semantic versions are left out of the generated selectors:
the oracle has neither library.
"""

from __future__ import annotations

import collections

import pytest

from tests.celgen import FOREIGN_DOMAIN, UNPUBLISHED_DOMAIN, SelectorGenerator, devices
from tests.celoracle import Oracle, compiles, dra_verdict, oracle_device

DRIVER = "gpu.nvidia.com"
SEED = 2026
SELECTORS = 400
DOMAINS = (DRIVER, FOREIGN_DOMAIN, UNPUBLISHED_DOMAIN, "resource.kubernetes.io")


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle()


def test_both_evaluators_agree_on_every_generated_selector_and_device(oracle: Oracle) -> None:
    published = devices(DRIVER)
    data = [oracle_device(device, DRIVER, DOMAINS) for device in published]
    selectors = SelectorGenerator(published, DRIVER, SEED).selectors(SELECTORS)
    verdicts: collections.Counter[str] = collections.Counter()
    disagreements = []
    for position, expression in enumerate(selectors):
        if not compiles(expression):
            # Rejected at write time by Kubernetes' type rules, which the oracle (compiling
            # unchecked) does not apply; the cluster differential test covers these.
            verdicts["rejected"] += 1
            continue
        for device, device_data in zip(published, data, strict=True):
            ours, theirs = dra_verdict(expression, device, DRIVER), oracle.verdict(expression, device_data)
            verdicts[ours] += 1
            if ours != theirs:
                disagreements.append(
                    f"#{position} on {device['name']}: dra.cel {ours}, oracle {theirs}: {expression}"
                )
    assert not disagreements, f"{len(disagreements)} disagreements (seed {SEED}):\n" + "\n".join(
        disagreements[:20]
    )
    # A generator that drifted into all-errors (or never erring) would prove little.
    total = sum(verdicts.values())
    assert all(verdicts[v] > total // 10 for v in ("true", "false", "error")), verdicts
    assert 0 < verdicts["rejected"] < SELECTORS // 10, verdicts


def test_the_generator_is_deterministic_and_varied() -> None:
    published = devices(DRIVER)
    first = SelectorGenerator(published, DRIVER, SEED).selectors(50)
    assert first == SelectorGenerator(published, DRIVER, SEED).selectors(50)
    assert len(set(first)) > 0.9 * len(first)
    text = "\n".join(SelectorGenerator(published, DRIVER, SEED).selectors(SELECTORS))
    for feature in (
        "&&",
        "||",
        "!(",
        " ? ",
        " in [",
        "has(",
        ".matches(",
        ".startsWith(",
        ".exists(",
        ".all(",
    ):
        assert feature in text, feature


# (expression, device attributes, dra.cel's verdict, the oracle's verdict, why they differ)
KNOWN_DIFFERENCES = [
    pytest.param(
        'device.attributes["gpu.nvidia.com"].type.substring(0, 3) == "gpu"',
        {"type": {"string": "gpu"}},
        "true",
        "error",
        id="oracle-bug-substring-end-at-size",
        # The strings extension makes the end exclusive, so end == size() is valid (cel-go
        # and Kubernetes give "gpu"); cel-expr-python 0.1.3 rejects it.
    ),
    pytest.param(
        f'has(device.attributes["{UNPUBLISHED_DOMAIN}"].index)',
        {"type": {"string": "gpu"}},
        "false",
        "error",
        id="kubernetes-unknown-domain-is-an-empty-map",
        # Kubernetes' own extension of CEL maps; plain CEL fails the lookup.  The
        # differential test hands the oracle this default as data.
    ),
    pytest.param(
        'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))',
        {"type": {"string": "gpu"}},
        "true",
        "error",
        id="kubernetes-quantity-library",
        # The Kubernetes CEL libraries (quantity, semver) exist in dra.cel only.
    ),
]


@pytest.mark.parametrize(("expression", "attributes", "ours", "theirs"), KNOWN_DIFFERENCES)
def test_known_differences_still_hold(
    oracle: Oracle, expression: str, attributes: dict[str, dict[str, object]], ours: str, theirs: str
) -> None:
    """Once the oracle changes, the note (and the generator's workaround) can go."""
    device = {"name": "gpu-0", "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}
    assert dra_verdict(expression, device, DRIVER) == ours
    assert oracle.verdict(expression, oracle_device(device, DRIVER)) == theirs


def test_the_oracle_compiles_unchecked_because_its_checker_rejects_dyn_ranges(oracle: Oracle) -> None:
    """cel-cpp's checker refuses a comprehension over a ``dyn`` map, which cel-go accepts."""
    expression = 'device.attributes["gpu.nvidia.com"].exists(k, k == "type")'
    with pytest.raises(RuntimeError, match="cannot be the range of a comprehension"):
        oracle.env.compile(expression)
    device = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    assert oracle.verdict(expression, oracle_device(device, DRIVER)) == "true"
    assert dra_verdict(expression, device, DRIVER) == "true"


def test_both_evaluators_agree_on_list_valued_attributes(oracle: Oracle) -> None:
    """KEP-5491: list attributes are CEL lists (membership, macros, indexing, equality)."""
    published = devices(DRIVER, lists=True)
    data = [oracle_device(device, DRIVER, DOMAINS) for device in published]
    selectors = [
        s
        for s in SelectorGenerator(published, DRIVER, SEED + 1).selectors(SELECTORS)
        # As above, those Kubernetes rejects at write time are the cluster test's.
        if ("links" in s or "zones" in s) and compiles(s)
    ]
    assert len(selectors) > 40
    verdicts: collections.Counter[str] = collections.Counter()
    disagreements = []
    for expression in selectors:
        for device, device_data in zip(published, data, strict=True):
            ours, theirs = dra_verdict(expression, device, DRIVER), oracle.verdict(expression, device_data)
            verdicts[ours] += 1
            if ours != theirs:
                disagreements.append(f"on {device['name']}: dra.cel {ours}, oracle {theirs}: {expression}")
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:20])
    assert all(verdicts[v] for v in ("true", "false", "error")), verdicts
