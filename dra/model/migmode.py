"""How the admin wants each GPU's MIG handled: static, dynamic or whole. Plain data and its parsing.

A default mode, then overrides per node (``@<node name>``) and per GPU index or UUID:
``static,@gpu-node-3=dynamic,2=dynamic,GPU-4b0e...=whole``, so one value serves every node of
a DaemonSet. What each mode publishes: docs/mig.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dra.model.migoffer import MigOffer

STATIC = "static"
DYNAMIC = "dynamic"
WHOLE = "whole"
MODES = (STATIC, DYNAMIC, WHOLE)


@dataclass(frozen=True)
class MigModes:
    """The default MIG mode and the GPUs (by index or UUID) that differ from it."""

    default: str = STATIC
    overrides: tuple[tuple[str, str], ...] = ()
    #: Node name -> the default on that node.
    nodes: tuple[tuple[str, str], ...] = ()
    #: Which profiles dynamic-MIG GPUs offer (--mig-profiles).
    offer: MigOffer = field(default_factory=MigOffer)

    def for_node(self, node_name: str) -> MigModes:
        """The modes on one node: its own default and offer where the values name the node."""
        return MigModes(
            dict(self.nodes).get(node_name, self.default),
            self.overrides,
            offer=self.offer.for_node(node_name),
        )

    def of(self, index: int, uuid: str) -> str:
        """The mode of one GPU: its UUID's override, else its index's, else the default."""
        by_key = dict(self.overrides)
        return by_key.get(uuid) or by_key.get(str(index)) or self.default


def parse_mig_modes(text: str) -> MigModes:
    """`dynamic` or `static,@node=dynamic,0=dynamic,GPU-...=whole`; ValueError naming the bad part."""
    default = STATIC
    overrides: list[tuple[str, str]] = []
    nodes: list[tuple[str, str]] = []
    for n, item in enumerate(part.strip() for part in text.split(",")):
        key, sep, mode = item.rpartition("=") if "=" in item else ("", "", item)
        if mode not in MODES:
            raise ValueError(f"{item!r}: the mode must be one of {', '.join(MODES)}")
        if not sep:
            if n:
                raise ValueError(f"{item!r}: only the first entry may be a bare mode (the default)")
            default = mode
        elif key.startswith("@") and len(key) > 1:
            nodes.append((key[1:], mode))
        elif not (key.isdigit() or key.startswith(("GPU-", "gpu-"))):
            raise ValueError(
                f"{item!r}: name a node (@node-a=dynamic), a GPU by index (2=dynamic) "
                "or a GPU by UUID (GPU-...=dynamic)"
            )
        else:
            overrides.append((key, mode))
    return MigModes(default, tuple(overrides), tuple(nodes))
