"""Fuzz target: the webhook's review decoding, from the body's bytes to the AdmissionReview answer.

atheris convention: TestOneInput(data) returns for every input, or raises what is a bug. A body
the webhook refuses (DocumentError, ReviewError: a 400 with the reason) is not a bug; any other
exception would be a 500. Each input is tried as a whole body and, when it is a JSON value, also
as the opaque parameters of a claim, where prepare's decoding runs.
"""

from __future__ import annotations

import json

from dra import documents
from dra.webhook.admission import ReviewError, review
from dra.webhook.server import MAX_BODY_BYTES

DRIVER = "gpu.nvidia.com"


def _as_parameters(parameters: object) -> dict[str, object]:
    claim = {"spec": {"devices": {"config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}]}}}
    request = {"uid": "fuzz", "kind": {"kind": "ResourceClaim"}, "operation": "CREATE", "object": claim}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def TestOneInput(data: bytes) -> None:  # noqa: N802 (atheris' name)
    """Decode `data` as a review body, and as a claim's opaque parameters."""
    try:
        body = documents.load_json(data, "the request body", MAX_BODY_BYTES)
    except documents.DocumentError:
        return
    for candidate in (body, _as_parameters(body)):
        try:
            answer, _ = review(candidate, DRIVER)
        except ReviewError:
            continue
        # The answer goes back as JSON: it must serialise, and say something short enough to log.
        json.dumps(answer)
