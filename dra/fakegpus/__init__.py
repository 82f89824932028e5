"""Fake GPUs: `--fake-gpus`, for clusters without GPUs (the demo, kind, an admin's CI).

``profiles`` reads a profile (a built-in name or a file); ``library`` is the GpuLibrary over it
(``mig``: its MIG calls, failing the way NVML fails; ``processes``: the processes declared to run
on it); ``node`` makes the device nodes and stand-in driver real containers see
(``--fake-gpu-root``), its libraries ELF objects ``elfstub`` writes; ``sysfs`` the PCI functions
passthrough binds; ``mpscontrol`` is the fake ``nvidia-cuda-mps-control``.

Rule: a user feature that never runs on a node with real GPUs. Only the daemons' bootstrap (when
--fake-gpus is given), the kubelet plugin's VFIO and MPS set-up with fake GPUs and the command
line's --mig-mode default may import it, each only on that path (a contract fences it); it imports
every layer below (the GPU library's protocol and tables, the file adapters, the drivers' names
of ``core.vfio``, the model), never a program.
"""
