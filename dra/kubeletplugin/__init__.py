"""The DRA kubelet plugin: `dra-gpu kubelet-plugin`, and `discover`, `time-slices` and `taint clear`.

From the top, as its layer contract has it: ``command`` runs the commands; ``daemon``
wires the plugin; ``server`` owns its sockets; ``claimmetrics`` samples the claims' join
metric; ``service`` (DRA and health gRPC), ``publisher`` (ResourceSlices, with
``features``: what the server keeps), ``podresources``, ``healthctl``, ``miglabel``,
``top`` and ``usage`` are what it serves, follows and reports; ``claimstatus`` writes
the prepared claims' status; ``miglayout`` runs static MIG layouts (dra.core's program)
on ``devicesteps``' GPU runner; ``state`` runs the steps of dra.core's prepare, unprepare and
start-up programs (a claim's own, the lock the program calls them under, and the group commit
that has a prepare's fsync wait, briefly, for the calls deciding beside it) over ``devicesteps``,
each feature's steps (the GPU's, MPS daemons', passthrough's, time slices', metadata files'); ``mps`` and
``timeslice`` act on the GPUs; ``mpsprivsep`` (the MPS launcher), ``mpslaunch`` and
``registration``.

Rule: a program package. It imports every layer below, the generated gRPC code
(``dra.pb``), and ``dra.fakegpus`` only where --fake-gpus is handled;
never another program package. Inside, each layer imports only those below it.
"""
