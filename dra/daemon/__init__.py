"""What every long-running program shares: one bootstrap and the services around it.

``bootstrap`` (GPU library, inventory, GPU assignment, start-up errors, the
probes/metrics endpoint), ``flags`` (every flag also a DRA_GPU_* variable),
``logs``, ``metrics`` (the only importer of prometheus_client), ``lifecycle``
(signals, heartbeat), ``health`` (device health from XID events),
``rediscovery`` (following GPU changes after start-up), ``sockets``,
``nodewatch`` (following the own Node) and ``fakegpus`` (fake GPUs a real
container can see). What serves one program only lives in that program.

Rule: may import the layers below (model, core, gpu, adapters); never a
program package (kubeletplugin, deviceplugin, labeller, explain, webhook).
"""
