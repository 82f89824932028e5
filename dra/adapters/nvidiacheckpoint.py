"""NVIDIA's DRA driver's checkpoint, found where ours belongs: recognised, then kept aside or refused.

NVIDIA's driver has the same driver name, so the same plugin directory, and the same file name: a
node that ran it (docs/migration.md, from NVIDIA's DRA driver) has its checkpoint where dra-gpu's
first start looks for its own. The checkpoint's decoder asks `nvidia_claims` whether the document
it read is NVIDIA's, and the store hands such a file to `keep_aside`: moved aside for the admin
when it holds no prepared claim, so the driver starts empty; refused, naming the claims, when it
does, since their CDI specs and MIG devices are that driver's. Met at start-up only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

#: Appended to the checkpoint's name when NVIDIA's DRA driver left its own there (kept for the admin).
NVIDIA_ASIDE = ".nvidia-dra-driver"


class NvidiaCheckpointError(Exception):
    """NVIDIA's checkpoint stays where it is: it records claims that driver prepared, or cannot be moved.

    The checkpoint store, which stands on this module, raises the message again as its own
    CheckpointError: the one error the daemons stop on for a checkpoint.
    """


def nvidia_claims(document: object) -> list[str] | None:
    """The prepared claims an NVIDIA DRA driver checkpoint records, or None when it is not one.

    Its shape (sigs.k8s.io/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/checkpointv.go): a
    checksum beside the formats it keeps, "v1" and "v2", each with "preparedClaims" by UID, v2's
    with the claim's name and namespace and its state: a prepare that failed stays
    "PrepareStarted" (that driver rolls it back on its next prepare), and only "PrepareCompleted"
    claims were handed to containers. v1 has no state: each of its claims was prepared.
    """
    if not isinstance(document, dict) or "checksum" not in document or not {"v1", "v2"} & set(document):
        return None
    found: dict[str, str] = {}
    for version in ("v2", "v1"):  # v2 names the claim
        body = document.get(version)
        prepared = body.get("preparedClaims") if isinstance(body, dict) else None
        for uid, claim in (prepared or {}).items() if isinstance(prepared, dict) else ():
            known = claim if isinstance(claim, dict) else {}
            if version == "v2" and known.get("checkpointState") != "PrepareCompleted":
                continue
            named = known.get("namespace") and known.get("name")
            found.setdefault(
                str(uid), f"{known['namespace']}/{known['name']} ({uid})" if named else f"claim {uid}"
            )
    return sorted(found.values())


def keep_aside(path: Path, claims: Sequence[str]) -> None:
    """Move NVIDIA's checkpoint at `path` aside when it records no prepared claim (`claims`, as
    `nvidia_claims` names them); NvidiaCheckpointError when it does, or when it cannot be moved."""
    if claims:
        raise NvidiaCheckpointError(
            f"checkpoint {path} is NVIDIA's DRA driver's and records claims it prepared: "
            f"{', '.join(claims)}; dra-gpu does not take over claims another driver prepared "
            "(their CDI specs and MIG devices are that driver's): run NVIDIA's driver again until the "
            "pods of those claims are gone (drain the node's GPU pods), then start dra-gpu "
            "(docs/migration.md, from NVIDIA's DRA driver)"
        )
    aside = path.with_name(f"{path.name}{NVIDIA_ASIDE}")
    try:
        os.replace(path, aside)
    except OSError as err:
        raise NvidiaCheckpointError(
            f"cannot move NVIDIA's DRA driver checkpoint {path} aside: {err}"
        ) from None
    log.warning(
        "checkpoint %s was NVIDIA's DRA driver's, with no claim prepared: kept as %s, starting empty",
        path,
        aside,
    )
