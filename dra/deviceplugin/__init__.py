"""The legacy device-plugin path: `nvidia.com/gpu` (and MIG resources) from the same inventory as DRA.

Pure parts: `config` (NVIDIA's config file, combined with the flags),
`resources` (which resource names, device IDs, placement, MIG strategy, replicas),
`preferred` (GetPreferredAllocation), `allocate` (what a container gets, per
device-list strategy). Edges: `service` (the DevicePlugin gRPC service),
`server` (its socket and the registration with the kubelet, renewed whenever
the kubelet restarts), `daemon` (the `dra-gpu device-plugin` process), `setup`
(the config file and flags, `--check-config`) and `command` (flags to daemon).

Rule: a program package. It may import every layer below (model, core, gpu, adapters,
daemon) and the generated gRPC code, never another program package. Inside (a layer contract):
``command`` over ``daemon`` over ``setup`` and ``server`` over ``configwatch`` and ``service``
over the pure parts (``named``, ``resources``, then ``config``, ``preferred``, then ``allocate``).
"""
