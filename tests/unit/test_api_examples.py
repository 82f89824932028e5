"""Every example in api/ says what the driver does with it, and the schemas in api/ are the types' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dra.api import schema
from dra.api.v1beta1 import MigDeviceConfig
from dra.core import config as deviceconfig
from dra.model.devices import Device
from tests.unit.helpers import inventory

API = Path(__file__).resolve().parents[2] / "api"
EXAMPLES = sorted(API.glob("*/examples/*.yaml"))


def _devices(kind: str) -> list[Device]:
    found = inventory("h100x8-mig")
    names = ["gpu-4-mig-1g10gb-3-0"] if kind == MigDeviceConfig.KIND else ["gpu-0", "gpu-1"]
    return [d for d in found if d.name in names]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_verdict_matches_the_driver(path: Path) -> None:
    text = path.read_text()
    first_line = text.splitlines()[0]
    parameters = yaml.safe_load(text)
    devices = _devices(parameters["kind"])
    quoted = re.search(r'"(.*)"', first_line)
    if first_line.startswith("# Accepted"):
        deviceconfig.checked(deviceconfig.decode(parameters), devices)
        return
    assert quoted, f"{path.name}: the first line must say Accepted, or Refused with the quoted message"
    assert first_line.startswith("# Refused"), path.name
    with pytest.raises(deviceconfig.ConfigError) as err:
        deviceconfig.checked(deviceconfig.decode(parameters), devices)
    assert quoted.group(1) in str(err.value)


def test_the_committed_schemas_are_generated_from_the_types() -> None:
    generated = schema.documents()
    committed = {str(p.relative_to(API)): p.read_text() for p in API.glob("*/*.schema.json")}
    assert set(committed) == set(generated), "run `make api`"
    for name, text in generated.items():
        assert committed[name] == text, f"api/{name} drifted from dra.api: run `make api`"
