"""dra-gpu: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs.

The package is layered; each sub-package states its rule in its docstring, and
the import contracts in pyproject.toml (``lint-imports``, run by ``make lint``)
enforce them. From the bottom up:

``model``
    Plain data (devices, inventories, prepared claims). Imports nothing of dra.
``api``
    The configuration API: typed, versioned opaque parameters (GpuConfig,
    MigDeviceConfig), strict decoding, validation against devices, JSON Schemas.
    Pure; imports only model.
``documents``
    Bounded YAML and JSON reading (size, depth, alias expansion, integer length) for
    every decoder of outside input. Imports only api (its quoting of values in messages).
``core`` and ``cel``
    Pure logic: slice planning, opaque-config validation, CDI rendering,
    claim reading, GPU assignment, prepare/unprepare decisions; the CEL
    evaluator. No I/O, no threads, no clocks: data in, data out.
``gpu``
    The GPU library: one ``GpuLibrary`` protocol, NVML behind it (the only
    importer of pynvml) and a fake of the same shape, and discovery from it.
``adapters``
    The outside world other than GPUs: the Kubernetes API (async; the only importer
    of the kubernetes client and aiohttp), files written atomically, the checkpoint, the CDI
    directory, the host's GPU assignment record.
``daemon``
    What every long-running subcommand shares: one bootstrap (flags and
    DRA_GPU_* variables, logging, metrics and probes, signals, start-up errors),
    health tracking, socket helpers.
``kubeletplugin``, ``deviceplugin``, ``labeller``, ``explain``, ``webhook``
    The programs: the DRA kubelet plugin, the legacy device plugin, the node
    labeller, the offline ``explain`` report, the admission webhook. Siblings:
    none imports another.
``cli``
    The ``dra-gpu`` command line, on top.

Generated gRPC code lives in ``dra.pb`` (from ``proto/``, never edited by hand)
and is imported only by the two daemon packages.
"""
