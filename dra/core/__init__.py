"""The driver's decisions, as pure functions over plain data.

Slice planning (``slices``), opaque configuration (``config``), CDI spec
rendering (``cdi``), reading a ResourceClaim's allocation (``allocation``), the
split of GPUs between DRA and the device plugin (``assignment``), the
prepare/unprepare decisions (``prepare``), what the API server accepts
(``versions``), the taint of an unhealthy device (``taints``) and static MIG
layouts in mig-parted's format with their placements (``migconfig``).

Rule: no I/O of any kind (files, network, NVML, clocks, threads); API objects
come in as dicts, answers go out as data. Imports only ``dra.model``. Tests
feed literal objects.
"""
