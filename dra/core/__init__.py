"""The driver's decisions, as pure functions over plain data.

Slices built (``slices``) and converged on (``sliceplan``), opaque configuration
(``config``), CDI spec rendering (``cdi``), reading a ResourceClaim's allocation
(``allocation``), the GPU split between DRA and the device plugin (``assignment``),
the prepare/unprepare decisions (``prepare``), GPU sharing (``sharing``), what the
API server accepts (``versions``), an unhealthy device's taint (``taints``), node
labels (``labels``), static MIG layouts (``migconfig``) and the checkpoint's
format (``checkpointformat``).

Rule: no I/O of any kind (files, network, NVML, clocks, threads); API objects come
in as dicts, answers go out as data. Imports only ``dra.api`` and ``dra.model``;
inside, the layers in pyproject.toml (prepare over single decisions over the API's
vocabulary). Tests feed literal objects.
"""
