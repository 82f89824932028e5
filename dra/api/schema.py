"""The JSON Schemas of the served kinds, generated from the types (`dra-gpu api-schema` writes them to api/).

A test compares the committed files with `documents()`, so they never drift from the decoder.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from dra.api.fields import schema_of
from dra.api.opaque import VERSIONS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema(api_version: str, kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind of one served version."""
    cls = VERSIONS[api_version].kinds[kind]
    body = schema_of(cls)
    version = api_version.rpartition("/")[2]
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"https://github.com/dra-gpu/dra-gpu/api/{version}/{kind.lower()}.schema.json",
        "title": f"{kind} ({api_version})",
        "description": inspect.getdoc(cls),
        "type": "object",
        "required": ["apiVersion", "kind"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            **body["properties"],
        },
    }


def documents() -> dict[str, str]:
    """Every schema file's text, keyed by its path under api/ (<version>/<kind>.schema.json)."""
    return {
        f"{api_version.rpartition('/')[2]}/{kind.lower()}.schema.json": json.dumps(
            schema(api_version, kind), indent=2
        )
        + "\n"
        for api_version, version in VERSIONS.items()
        for kind in version.kinds
    }
