"""What every long-running subcommand shares: one bootstrap and its services.

``bootstrap`` (GPU library, inventory, GPU assignment, start-up errors, the
probes/metrics endpoint), ``flags`` (every flag also a DRA_GPU_* variable),
``logs``, ``metrics`` (the only importer of prometheus_client), ``lifecycle``
(signals, heartbeat), ``health`` (device health from XID events),
``rediscovery`` (following GPU changes after start-up), ``sockets``,
``nodewatch`` (following the own Node), ``miglayout`` (static MIG layouts,
mig-parted's format, applied to the GPUs) and ``miglabel`` (which layout the
Node's label names, at start and on a change; the state label and Events).

Rule: may import the layers below (model, core, gpu, adapters); never a
program package (kubeletplugin, deviceplugin, explain).
"""
