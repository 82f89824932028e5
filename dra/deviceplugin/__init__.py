"""The legacy device-plugin path: `nvidia.com/gpu` (and MIG resources) from the same inventory as DRA.

Pure parts: `resources` (which resource names, device IDs, placement),
`preferred` (GetPreferredAllocation), `allocate` (what a container gets, per
device-list strategy). Edges: `service` (the DevicePlugin gRPC service),
`server` (its socket and the registration with the kubelet, renewed whenever
the kubelet restarts), `daemon` (the `dra-gpu device-plugin` process).
"""
