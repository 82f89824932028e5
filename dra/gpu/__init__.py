"""The GPU library: what the driver knows about the node's GPUs and can do to them.

``library`` defines the ``GpuLibrary`` protocol, one method per NVML call the driver uses, with
NVML's value types and return codes; ``nvml`` implements it on pynvml. ``migtables`` holds the MIG
profiles and placements NVML reports; ``discovery`` maps a library's answers to an ``Inventory``
(with no branch for fake GPUs, which implement the same protocol in ``dra.fakegpus``);
``dynamic`` makes, finds and destroys MIG instances (dynamic MIG's devices, static layouts'), one
NVML step at a time; ``driverfiles`` finds the driver's files the CDI specs mount, ``numa`` a
GPU's NUMA nodes.

Rule: imports only ``dra.model``; ``nvml`` is the only importer of pynvml; inside, discovery and
the MIG steps over the protocol and its tables (a layer contract); device actions go through the
protocol so that a fake stands in for every one.
"""
