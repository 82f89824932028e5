"""Fuzz target: ``dra-gpu explain``'s loader and report on a claim or class file.

The input is the file's text (YAML, one or more documents). Reading it and explaining
every claim in it against a fake 8-GPU node must give a report or one of the one-line errors
the command prints (StartupError, ExplainError), never another exception.
"""

from __future__ import annotations

import json

from dra.core.slices import build_slices
from dra.daemon.bootstrap import StartupError
from dra.explain import command, shapes
from dra.explain import report as explain
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover

DRIVER = "gpu.nvidia.com"
SLICES = build_slices(discover(FakeGpuLibrary(load_profile("h100x8-mig"), "node")), DRIVER, "node", None, 1)
STANDARD = explain.standard_device_classes(DRIVER)


def TestOneInput(data: bytes) -> None:  # noqa: N802  (the name atheris and libFuzzer expect)
    """Load one file's text and explain its claims; raise only on a bug."""
    text = data.decode("utf-8", "replace")
    try:
        classes, claims = command.split_documents(command.parse_documents(text, "claim.yaml"))
        for claim in claims:
            found = explain.explain_claim(claim, [*STANDARD, *classes.values()], SLICES)
            explain.render(found)
            json.dumps(explain.as_json(found))
    except (StartupError, shapes.ExplainError) as err:
        message = str(err).strip()
        if not message or "\n" in message:
            raise AssertionError(f"not a one-line error: {message!r}") from err
