"""The GPU library: what the driver knows about the node's GPUs and can do to them.

``nvml`` defines the ``GpuLibrary`` protocol, one method per NVML call the
driver uses, and implements it on pynvml (the only importer of pynvml).
``fake`` implements the same protocol from a fake-GPU profile (``profiles``),
failing the way NVML fails, with MIG placements from ``migtables``. ``discovery``
maps a library's answers to an ``Inventory``, with no branch for fake GPUs;
``dynamic`` makes, finds and destroys the MIG devices of dynamic MIG, one NVML
step at a time.

Rule: imports ``dra.model`` only; device actions (MIG, time-slicing) go
through the protocol so that the fake can stand in for every one.
"""
