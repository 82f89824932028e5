"""Which gated ResourceSlice features the API server keeps, asked once at start.

The version alone does not say: on 1.34 an alpha gate may be on or off, and a
server with a gate off drops that feature's fields without an error. So the
driver dry-run creates throwaway slices for its node that use every gated field
(dra.core.versions.probe_slices) and reads which fields came back. Nothing is
stored; a dry run passes through validation and admission like a real create.
"""

from __future__ import annotations

import logging

from dra.adapters.kube import KubeClient, KubeError, Obj
from dra.core import versions

log = logging.getLogger(__name__)

#: The status of a create the server refuses as invalid.
UNPROCESSABLE = 422


async def detect_features(
    kube: KubeClient, info: versions.ServerInfo | None, driver: str, node_name: str
) -> versions.ApiFeatures:
    """ApiFeatures of this server; each feature it lacks is logged once, naming its gate.

    `info` None (the server did not say its version) or a failed probe leaves
    on only what no gate can turn off at that version, with a warning.
    """
    if info is None:
        found = versions.assumed_features(versions.ServerInfo("", 0, ()))
        log.warning("API server version unknown: publishing no gated ResourceSlice fields")
        return found
    answers: list[Obj] = []
    try:
        for batch in versions.probe_slices(driver, node_name, info.minor):
            for obj in batch:
                answers.append(await kube.dry_run_create_resource_slice(obj))
        answers.extend(await _list_probe(kube, driver, node_name))
    except KubeError as err:
        found = versions.assumed_features(info)
        log.warning(
            "cannot ask the API server which ResourceSlice fields it keeps (%s); assuming %s",
            err,
            _describe(found),
        )
        return found
    found = versions.features(info, versions.kept_fields(answers))
    for line in versions.missing(found):
        log.warning("%s", line)
    log.info("API server %s keeps %s", info.git_version, _describe(found))
    return found


async def _list_probe(kube: KubeClient, driver: str, node_name: str) -> list[Obj]:
    """The answer to the list-typed attribute probe; none when the server refused it as invalid (dropped)."""
    try:
        return [await kube.dry_run_create_resource_slice(versions.list_probe_slice(driver, node_name))]
    except KubeError as err:
        if err.status == UNPROCESSABLE:
            return []
        raise


def _describe(found: versions.ApiFeatures) -> str:
    on = [what for name, (_, what, _) in versions.GATES.items() if getattr(found, name)]
    return ", ".join(on) or "no gated ResourceSlice fields"
