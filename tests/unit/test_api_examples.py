"""Every example in api/ says whether the driver accepts it; the parser must agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dra.core import config as deviceconfig

API = Path(__file__).resolve().parents[2] / "api"
EXAMPLES = sorted((API / "v1beta1" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_verdict_matches_the_parser(path: Path) -> None:
    text = path.read_text()
    first_line = text.splitlines()[0]
    parameters = yaml.safe_load(text)
    if first_line.startswith("# Accepted"):
        deviceconfig.parse(parameters)
    else:
        expected = re.search(r'"(.+)"', first_line)
        assert expected, f"{path.name}: the first line must say Accepted, or Refused with the quoted message"
        with pytest.raises(deviceconfig.ConfigError, match=re.escape(expected.group(1))):
            deviceconfig.parse(parameters)


def test_schemas_list_what_the_parser_knows() -> None:
    for name, kind in (
        ("gpuconfig", deviceconfig.GPU_CONFIG),
        ("migdeviceconfig", deviceconfig.MIG_DEVICE_CONFIG),
    ):
        schema = json.loads((API / "v1beta1" / f"{name}.schema.json").read_text())
        assert schema["properties"]["apiVersion"]["const"] == deviceconfig.API_VERSION
        assert schema["properties"]["kind"]["const"] == kind
        sharing = schema["properties"]["sharing"]["properties"]
        assert tuple(sharing["strategy"]["enum"]) == deviceconfig.STRATEGIES
        if "timeSlicingConfig" in sharing:
            assert (
                tuple(sharing["timeSlicingConfig"]["properties"]["interval"]["enum"])
                == deviceconfig.INTERVALS
            )
