"""Fuzz target: the YAML/JSON inputs of the node and of explain, from bytes to their checked form.

atheris convention: TestOneInput(data) returns for every input, or raises what is a bug. Each
input goes through dra.documents and then every parser that reads such a file: the device
plugin's config, the MIG layouts, the fake-GPU profiles, and explain's claims and classes.
A refusal with a message (each parser's own error type) is not a bug; anything else is.
"""

from __future__ import annotations

import contextlib

from dra import documents
from dra.core.migconfig import MigConfigError, parse_mig_configs
from dra.core.slices import build_slices
from dra.deviceplugin import config as dpconfig
from dra.explain import report as explain
from dra.explain import shapes
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import ProfileError, load_profile, parse_profile
from dra.gpu.discovery import discover

DRIVER = "gpu.nvidia.com"
CLASSES = explain.standard_device_classes(DRIVER)
#: A node's slices to explain claims against: dynamic MIG, so counters are read too.
SLICES = build_slices(
    discover(FakeGpuLibrary(load_profile("a100x4-dynamic-mig"), "node-a")), DRIVER, "node-a", None, 1
)


def TestOneInput(data: bytes) -> None:  # noqa: N802 (atheris' name)
    """Read `data` as each kind of file the driver reads."""
    try:
        loaded = documents.load_yaml_all(data, "fuzz")
    except documents.DocumentError:
        return
    for document in loaded:
        for parse, refusal in (
            (lambda d: dpconfig.config_from(d, "fuzz"), dpconfig.ConfigError),
            (lambda d: parse_mig_configs(d, "fuzz"), MigConfigError),
            (lambda d: parse_profile(d, "fuzz"), ProfileError),
        ):
            with contextlib.suppress(refusal):
                parse(document)
        for kind in shapes.SHAPES:
            try:
                shapes.check_shape(document, kind)
                if kind != "DeviceClass" and isinstance(document, dict):
                    explain.explain_claim({**document, "kind": kind}, CLASSES, SLICES)
            except shapes.ExplainError:
                pass
