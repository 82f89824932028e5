"""Opaque parameters to typed configs: the size limit, then apiVersion and kind, then the version's types.

Both the admission webhook and prepare start here, so they accept and refuse the same
parameters with the same messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra.api import v1beta1
from dra.api.fields import FieldError, check_unique, nesting_depth

#: Kubernetes' limit on opaque parameters (resource.k8s.io OpaqueParametersMaxLength), in bytes.
MAX_PARAMETERS_BYTES = 10 * 1024
#: The API's types nest a few levels; deeper parameters are refused before anything walks them.
MAX_PARAMETERS_DEPTH = 32

DeviceConfig = v1beta1.DeviceConfig


@dataclass(frozen=True)
class Version:
    """One served apiVersion: its kinds and its decoder."""

    kinds: Mapping[str, type]
    decode: Callable[[str, Mapping[str, object]], DeviceConfig]


#: The served versions; a new version is one more entry.
VERSIONS = {v1beta1.API_VERSION: Version(v1beta1.KINDS, v1beta1.decode_config)}


def decode(parameters: Mapping[str, Any]) -> DeviceConfig:
    """The normalized config of one opaque parameters object; FieldError naming the bad field."""
    if nesting_depth(parameters, MAX_PARAMETERS_DEPTH) > MAX_PARAMETERS_DEPTH:
        raise FieldError((), f"nested deeper than {MAX_PARAMETERS_DEPTH} levels")
    # apiVersion and kind twice too: the fields below are decoded from a copy, which keeps one.
    check_unique(parameters, ())
    size = len(json.dumps(parameters, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_PARAMETERS_BYTES:
        raise FieldError((), f"{size} bytes of JSON, more than the {MAX_PARAMETERS_BYTES} bytes allowed")
    api_version = parameters.get("apiVersion")
    version = VERSIONS.get(api_version) if isinstance(api_version, str) else None
    if version is None:
        raise FieldError(
            ("apiVersion",),
            f"{json.dumps(api_version)} is not served; use one of {json.dumps(list(VERSIONS))}",
        )
    kind = parameters.get("kind")
    if kind in v1beta1.COMPUTE_DOMAIN_KINDS and api_version == v1beta1.API_VERSION:
        raise FieldError(
            ("kind",),
            f"{kind} configures NVIDIA's ComputeDomain driver (compute-domain.nvidia.com), not GPUs; "
            "this driver has no ComputeDomains",
        )
    if not isinstance(kind, str) or kind not in version.kinds:
        raise FieldError(("kind",), f"{json.dumps(kind)} is not one of {json.dumps(list(version.kinds))}")
    body = {k: v for k, v in parameters.items() if k not in ("apiVersion", "kind")}
    return version.decode(kind, body)
