"""`dra-gpu explain`: gather the claim, classes and devices (files, cluster or fake GPUs), then report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio

from dra import documents
from dra.adapters.kube import KubeClient, KubeError, NotFoundError
from dra.cel import Budget
from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.daemon.bootstrap import StartupError, gpu_library, load_inventory, warn_about_unmatched_mig_modes
from dra.explain import report as explain
from dra.explain import shapes

Obj = dict[str, Any]
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")


def _documents(path: Path) -> list[Obj]:
    """The claims and classes of a manifest file, each checked for the types the report reads."""
    try:
        text = documents.read_file(path, "manifest")
    except documents.DocumentError as err:
        raise StartupError(str(err)) from None
    return parse_documents(text, str(path))


def parse_documents(text: bytes | str, source: str) -> list[Obj]:
    """The claims and classes among the YAML documents of ``text``, each checked for the types the
    report reads; StartupError naming ``source`` and the field.
    """
    try:
        loaded = documents.load_yaml_all(text, source)
    except documents.DocumentError as err:
        raise StartupError(str(err)) from None
    found = []
    for i, doc in enumerate(loaded):
        # A kind that is no string (a mapping, say: a second `kind:` key overrides the first) is no
        # kind explain reads, like any other; it must not reach the lookup, which needs a hashable key.
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        if not isinstance(kind, str) or kind not in shapes.SHAPES:
            continue
        try:
            shapes.check_shape(doc, kind, strict=True)
        except shapes.ExplainError as err:
            raise StartupError(f"{source}: document {i + 1} ({doc['kind']}): {err}") from None
        found.append(doc)
    return found


def split_documents(found: list[Obj]) -> tuple[dict[str, Obj], list[Obj]]:
    """DeviceClasses by name and the claims (or claim templates) among checked documents."""
    classes = {doc["metadata"]["name"]: doc for doc in found if doc.get("kind") == "DeviceClass"}
    return classes, [doc for doc in found if doc.get("kind") in CLAIM_KINDS]


class _Inputs:
    """What explain needs, from files first, then the cluster or the standard classes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        try:
            self.kube = None if args.fake_gpus else KubeClient(args.kubeconfig or None)
        except KubeError as err:
            raise StartupError(f"{err} (or explain offline with --fake-gpus)") from None
        self.classes: dict[str, Obj] = {}
        self.claims: list[Obj] = []

    async def read_arguments(self) -> None:
        """The classes and the claim the arguments name, from files or the cluster."""
        for spec in self.args.device_class or []:
            if await anyio.Path(spec).is_file():
                self._take(_documents(Path(spec)))
            else:
                self.classes[spec] = await self._cluster_class(spec)
        if self.args.claim:
            if await anyio.Path(self.args.claim).is_file():
                self._take(_documents(Path(self.args.claim)))
            else:
                self.claims.append(await self._cluster_claim(self.args.claim))

    def _take(self, documents: list[Obj]) -> None:
        classes, claims = split_documents(documents)
        self.classes.update(classes)
        self.claims.extend(claims)

    async def _cluster_claim(self, ref: str) -> Obj:
        namespace, sep, name = ref.partition("/")
        if not sep or self.kube is None:
            raise StartupError(
                f"--claim {ref!r}: not a file; a cluster claim is NAMESPACE/NAME (without --fake-gpus)"
            )
        try:
            return await self.kube.get_resource_claim(namespace, name)
        except KubeError as err:
            raise StartupError(f"--claim {ref}: {err}") from None

    async def _cluster_class(self, name: str) -> Obj:
        if self.kube is None:
            raise StartupError(
                f"--device-class {name!r}: not a file, and without a cluster there is no class by name"
            )
        try:
            return await self.kube.get_device_class(name)
        except KubeError as err:
            raise StartupError(f"--device-class {name}: {err}") from None

    async def device_classes(self) -> list[Obj]:
        """Every class the claims name: given ones, else the cluster's, else the standard ones."""
        standard = {c["metadata"]["name"]: c for c in explain.standard_device_classes(self.args.driver_name)}
        wanted = {
            sub.get("deviceClassName")
            for claim in self.claims
            for request in _requests(claim)
            for sub in (request.get("firstAvailable") or [request.get("exactly") or {}])
        }
        for name in sorted(n for n in wanted if n and n not in self.classes):
            if self.kube is not None:
                try:
                    self.classes[name] = await self.kube.get_device_class(name)
                except NotFoundError:
                    continue
                except KubeError as err:
                    raise StartupError(f"DeviceClass {name}: {err}") from None
            elif name in standard:
                self.classes[name] = standard[name]
        return list(self.classes.values())

    async def slices(self) -> list[Obj]:
        """The node's ResourceSlices: live, or built from the fake profile."""
        if self.kube is None:
            modes = self.args.mig_mode.for_node(self.args.node_name or "")
            inventory = load_inventory(gpu_library(self.args.fake_gpus, self.args.node_name), modes)
            warn_about_unmatched_mig_modes(inventory, modes)
            # Offline, dynamic-MIG GPUs come with their counters, as a server that keeps them sees them.
            features = ApiFeatures(partitionable_devices=True)
            return build_slices(
                inventory, self.args.driver_name, self.args.node_name, None, generation=1, features=features
            )
        if not self.args.node_name:
            raise StartupError("--node-name is needed to read a node's ResourceSlices from the cluster")
        try:
            return await self.kube.list_node_resource_slices(self.args.node_name)
        except KubeError as err:
            raise StartupError(
                f"cannot list the ResourceSlices of node {self.args.node_name}: {err}"
            ) from None

    async def other_claims(self) -> list[Obj]:
        """Claims of the cluster, to show which devices are taken (none offline)."""
        if self.kube is None:
            return []
        try:
            return await self.kube.list_resource_claims()
        except KubeError as err:
            raise StartupError(f"cannot list ResourceClaims: {err}") from None


def _requests(claim: Obj) -> list[Obj]:
    spec = claim.get("spec") or {}
    if claim.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    return list((spec.get("devices") or {}).get("requests") or [])


def _class_only_claim(name: str) -> Obj:
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": f"(any device of DeviceClass {name})"},
        "spec": {"devices": {"requests": [{"name": "device", "exactly": {"deviceClassName": name}}]}},
    }


def reports(args: argparse.Namespace) -> list[explain.ClaimReport]:
    """Every report the arguments ask for."""
    return anyio.run(_reports, args)


async def _reports(args: argparse.Namespace) -> list[explain.ClaimReport]:
    inputs = _Inputs(args)
    try:
        await inputs.read_arguments()
        classes = await inputs.device_classes()
        if not inputs.claims and not classes:
            raise StartupError(
                "give --claim (a file or NAMESPACE/NAME) and/or --device-class (a file or a name)"
            )
        claims = inputs.claims or [_class_only_claim(name) for name in inputs.classes]
        slices = await inputs.slices()
        others = await inputs.other_claims()
        budget = Budget(explain.EXPLAIN_COST_BUDGET)
        return [explain.explain_claim(claim, classes, slices, others, budget) for claim in claims]
    except shapes.ExplainError as err:
        raise StartupError(str(err)) from None
    finally:
        if inputs.kube is not None:
            await inputs.kube.aclose()


def run(args: argparse.Namespace) -> int:
    """Print the reports; exit 0 (the report itself says whether a claim can be allocated)."""
    if args.fake_gpus and not args.node_name:
        args.node_name = "fake-node"
    found = reports(args)
    if args.output == "json":
        print(json.dumps([explain.as_json(r) for r in found], indent=2))
    else:
        print("\n\n".join(explain.render(r) for r in found))
    return 0
