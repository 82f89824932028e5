"""The DRA kubelet plugin: `dra-gpu kubelet-plugin`.

``daemon`` wires it together; ``server`` and ``registration`` own the unix
sockets and the kubelet's plugin registration; ``service`` answers the DRA
v1/v1beta1 and health gRPC services; ``state`` runs the prepare, unprepare
and start-up programs of ``dra.core`` (their steps) on the CDI directory, the
checkpoint and the GPUs;
``publisher`` keeps the node's ResourceSlices in line with the inventory.

Rule: a program package. It may import every layer below (model, core, gpu,
adapters, daemon) and the generated gRPC code, never another program package.
"""
