"""How the admin wants each GPU's MIG handled: static, dynamic or whole. Plain data and its parsing.

A default mode, then overrides per node (``@<node name>``) and per GPU index or UUID:
``static,@gpu-node-3=dynamic,2=dynamic,GPU-4b0e...=whole``, so one value serves every node of
a DaemonSet. What each mode publishes: docs/mig.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dra.model.devices import GPU_UUID, MAX_GPUS, gpu_index
from dra.model.migoffer import MigOffer
from dra.model.quoting import quote

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
        return by_key.get(_uuid_key(uuid)) or by_key.get(str(index)) or self.default

    def unmatched(self, gpus: Iterable[tuple[int, str]]) -> list[str]:
        """The overrides that name none of these GPUs (index, UUID), as given: `99=dynamic`."""
        names = {key for index, uuid in gpus for key in (str(index), _uuid_key(uuid))}
        return [f"{key}={mode}" for key, mode in self.overrides if key not in names]


def _uuid_key(uuid: str) -> str:
    """A GPU UUID as NVML spells it (GPU-, then lower-case hexadecimal digits), in whichever case given."""
    return f"GPU-{uuid[4:].lower()}"


def parse_mig_modes(text: str) -> MigModes:
    """`dynamic` or `static,@node=dynamic,0=dynamic,GPU-...=whole`; ValueError naming the bad part."""
    default = STATIC
    overrides: list[tuple[str, str]] = []
    nodes: list[tuple[str, str]] = []
    for n, item in enumerate(part.strip() for part in text.split(",")):
        key, sep, mode = item.rpartition("=") if "=" in item else ("", "", item)
        if mode not in MODES:
            raise ValueError(f"{quote(item)}: the mode must be one of {', '.join(MODES)}")
        if not sep:
            if n:
                raise ValueError(f"{quote(item)}: only the first entry may be a bare mode (the default)")
            default = mode
        elif key.startswith("@") and len(key) > 1:
            nodes.append((key[1:], mode))
        else:
            gpu = str(index) if (index := gpu_index(key)) is not None else _uuid_key(key)
            if index is None and not GPU_UUID.fullmatch(key):
                raise ValueError(
                    f"{quote(item)}: name a node (@node-a=dynamic), a GPU by index from 0 to "
                    f"{MAX_GPUS - 1} (2=dynamic) or a GPU by UUID (GPU- and 8-4-4-4-12 hexadecimal digits)"
                )
            if gpu in dict(overrides):
                raise ValueError(f"{quote(item)}: GPU {key} has a mode already; give each GPU one")
            overrides.append((gpu, mode))
    return MigModes(default, tuple(overrides), tuple(nodes))
