"""The DRA kubelet plugin: `dra-gpu kubelet-plugin`, and `discover`, `time-slices` and `taint clear`.

From the top, as the layers in pyproject.toml have it: ``command`` runs the commands;
``daemon`` wires the plugin; ``server`` owns its sockets; ``service`` (DRA and health
gRPC), ``publisher`` (ResourceSlices, with ``features``: what the server keeps),
``podresources``, ``healthctl`` and ``miglabel`` are what it serves and follows; ``state``
runs the steps of dra.core's prepare, unprepare and start-up programs; ``miglayout``,
``mps`` and ``timeslice`` act on the GPUs; ``mpslaunch`` and ``registration`` are what
those stand on.

Rule: a program package. It may import every layer below (model, core, gpu, adapters,
daemon) and the generated gRPC code, never another program package.
"""
