"""What every long-running program shares: one bootstrap and the services around it.

``bootstrap`` (GPU library, inventory, GPU assignment, start-up errors, the
probes/metrics endpoint), ``flags`` (every flag also a DRA_GPU_* variable),
``logs``, ``metrics`` (the only importer of prometheus_client), ``lifecycle``
(signals, heartbeat), ``health`` (device health from XID events),
``rediscovery`` (following GPU changes after start-up), ``sockets`` and
``nodewatch`` (following the own Node). What serves one program only lives in
that program.

Rule: imports every layer below, and ``dra.fakegpus`` only in the bootstrap's --fake-gpus
branch; never a program package. Inside (a layer contract):
``rediscovery`` over ``bootstrap`` over the services, none of which imports another.
"""
