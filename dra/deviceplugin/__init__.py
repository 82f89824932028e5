"""The legacy device-plugin path: `nvidia.com/gpu` (and MIG resources) from the same inventory as DRA.

Pure parts: `config` (NVIDIA's config file, combined with the flags),
`resources` (which resource names, device IDs, placement, MIG strategy, replicas),
`preferred` (GetPreferredAllocation), `allocate` (what a container gets, per
device-list strategy). Edges: `service` (the DevicePlugin gRPC service),
`server` (its socket and the registration with the kubelet, renewed whenever
the kubelet restarts), `daemon` (the `dra-gpu device-plugin` process), `setup`
(the config file and flags, `--check-config`) and `command` (flags to daemon).

Rule: a program package. It imports every layer below and the generated gRPC code
(``dra.pb``), never another program package or the fakes. Inside (a layer contract):
``command`` over ``daemon`` over ``setup`` and ``server`` over ``configwatch`` and ``service``
over the pure parts (``named``, ``resources``, then ``config``, ``preferred``, then ``allocate``).
"""
