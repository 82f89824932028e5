"""The GPU library: what the driver knows about the node's GPUs and can do to them.

``library`` defines the ``GpuLibrary`` protocol, one method per NVML call the
driver uses, with NVML's value types and return codes; ``nvml`` implements it
on pynvml (the only importer of pynvml). ``fake`` implements the same protocol
from a fake-GPU profile (``profiles``), its MIG calls in ``fakemig``, failing
the way NVML fails, with MIG placements from ``migtables``. ``discovery``
maps a library's answers to an ``Inventory``, with no branch for fake GPUs;
``dynamic`` makes, finds and destroys the MIG devices of dynamic MIG, one NVML
step at a time. Where there is no GPU, ``nvml`` runs over the fake NVML library
of the local cluster's tooling (deploy/local/fakenvml), which answers from ``fake``.

Rule: imports ``dra.model`` only; device actions (MIG, time-slicing) go
through the protocol so that the fake can stand in for every one.
"""
