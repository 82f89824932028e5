"""The DRA kubelet plugin: `dra-gpu kubelet-plugin`, and the commands about what it publishes.

``command`` runs `kubelet-plugin`, `discover`, `time-slices` and `taint clear`;
``daemon`` wires the plugin together; ``server`` and ``registration`` own the unix
sockets and the kubelet's plugin registration; ``service`` answers the DRA
v1/v1beta1 and health gRPC services; ``state`` applies the pure prepare decisions
of ``dra.core.prepare`` to the CDI directory and the checkpoint, with device
actions by ``mps``/``mpslaunch``, ``timeslice`` and dynamic MIG; ``publisher``
keeps the node's ResourceSlices in line with the inventory (``features``: what the
server keeps); ``miglayout`` applies static MIG layouts and ``miglabel`` follows
the Node label that names one; ``healthctl`` is the admin's socket to clear a
device's unhealthy mark; ``podresources`` holds back GPUs device-plugin containers use.

Rule: a program package. It may import every layer below (model, core, gpu,
adapters, daemon) and the generated gRPC code, never another program package;
inside, the layers in pyproject.toml.
"""
