"""Which MIG profiles a dynamic-MIG GPU offers (--mig-profiles). Plain data, its parsing and the selection.

A comma-separated list of ``common`` (per 1, 2, 3 and 7 compute slices the profile with the
least memory, no media extensions), ``all``, or profile names as nvidia-smi prints them, with
``@<node>=<item>`` entries that replace the bare items on that node, so one value serves every
node of a DaemonSet. Fewer offers buy scheduling throughput: docs/mig.md ("Choosing the
profiles offered").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dra.model.devices import MigPartition

ALL = "all"
COMMON = "common"
#: The compute-slice counts of the common profiles: the usual splits of a 7-slice GPU.
COMMON_SLICES = (1, 2, 3, 7)
#: The flag's default, chosen by the scheduler benchmark (docs/mig.md). A MigOffer built in code
#: without items keeps every offer, which is what discovery does when nobody asks for less.
DEFAULT = COMMON

_PROFILE = re.compile(r"^[1-8]g\.[0-9]+gb(\+me)?$")


@dataclass(frozen=True)
class MigOffer:
    """The profiles dynamic MIG offers: the items of the default and of named nodes."""

    items: frozenset[str] = frozenset({ALL})
    #: Node name -> the items on that node, in place of `items`.
    nodes: tuple[tuple[str, frozenset[str]], ...] = ()

    def for_node(self, node_name: str) -> MigOffer:
        """The offer on one node: its own items where the value names the node."""
        return MigOffer(dict(self.nodes).get(node_name, self.items))

    def select(self, offers: Sequence[MigPartition]) -> list[MigPartition]:
        """The offers of one GPU (every profile at every placement) that this value keeps, in order."""
        if ALL in self.items:
            return list(offers)
        keep = {name for name in self.items if name != COMMON}
        if COMMON in self.items:
            keep |= common_profiles(offers)
        return [p for p in offers if p.profile in keep]

    def unmatched(self, offers: Iterable[MigPartition]) -> list[str]:
        """The profile names this value lists that no offer has (a typo, or a profile of another model)."""
        have = {p.profile for p in offers}
        return sorted(name for name in self.items if name not in (ALL, COMMON) and name not in have)


def common_profiles(offers: Iterable[MigPartition]) -> set[str]:
    """Per compute-slice count in COMMON_SLICES, the profile of fewest memory slices, no media extensions."""
    best: dict[int, MigPartition] = {}
    for p in offers:
        if p.slices not in COMMON_SLICES or p.profile.endswith("+me"):
            continue
        if p.slices not in best or p.placement_size < best[p.slices].placement_size:
            best[p.slices] = p
    return {p.profile for p in best.values()}


def _item(text: str, where: str) -> str:
    if text in (ALL, COMMON) or _PROFILE.match(text):
        return text
    raise ValueError(
        f"{where!r}: expected all, common or a MIG profile name as nvidia-smi prints it "
        "(1g.10gb, 4g.40gb, 1g.10gb+me)"
    )


def parse_mig_offer(text: str) -> MigOffer:
    """`common`, `1g.10gb,2g.20gb` or `common,@node-a=all`; ValueError naming the bad part."""
    items: set[str] = set()
    nodes: dict[str, set[str]] = {}
    for part in (p.strip() for p in text.split(",")):
        if part.startswith("@"):
            node, sep, item = part[1:].partition("=")
            if not (node and sep and item):
                raise ValueError(f"{part!r}: a node entry is @<node>=<item>, e.g. @gpu-node-3=all")
            nodes.setdefault(node, set()).add(_item(item, part))
        else:
            items.add(_item(part, part))
    if not items:
        raise ValueError(
            f"{text!r}: name the profiles every other node offers first, e.g. common,@node-a=all"
        )
    return MigOffer(frozenset(items), tuple((n, frozenset(i)) for n, i in sorted(nodes.items())))
