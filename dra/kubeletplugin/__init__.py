"""The DRA kubelet plugin: `dra-gpu kubelet-plugin`.

``daemon`` wires it together; ``server`` and ``registration`` own the unix
sockets and the kubelet's plugin registration; ``service`` answers the DRA
v1/v1beta1 and health gRPC services; ``state`` applies the pure prepare
decisions of ``dra.core.prepare`` to the CDI directory and the checkpoint;
``publisher`` keeps the node's ResourceSlices in line with the inventory.

Rule: a program package. It may import every layer below (model, core, gpu,
adapters, daemon) and the generated gRPC code, never another program package.
"""
