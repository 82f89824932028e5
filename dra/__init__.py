"""dra-gpu: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs.

The package is layered; each sub-package states its rule in its docstring, and
the import contracts in pyproject.toml (``lint-imports``, run by ``make lint``)
enforce them, whole packages at a time. From the bottom up:

``model`` (and ``pb``)
    Plain data (devices, inventories, prepared claims); imports nothing of dra.
    ``pb`` is the generated gRPC code (from ``proto/``, never edited by hand),
    which only the kubelet plugin and the device plugin may import.
``api``
    The configuration API: typed, versioned opaque parameters, strict decoding,
    validation against devices, JSON Schemas. Pure; imports only model.
``documents``
    Bounded YAML and JSON reading (size, depth, alias expansion, integer length) for
    every decoder of outside input. Imports only api (its quoting of values in messages).
``core``, ``cel`` and ``gpu``
    ``core``: the driver's decisions, pure (data in, data out: no I/O, threads or
    clocks), imports only api and model; ``cel``: the CEL evaluator, pure;
    ``gpu``: the ``GpuLibrary`` protocol, NVML behind it (the only importer of
    pynvml), and discovery; ``cel`` and ``gpu`` import only model.
``adapters``
    The outside world other than GPUs: the Kubernetes API (the only importer of
    the kubernetes client and of an HTTP client), files written atomically, the checkpoint
    file, the CDI directory, the host's GPU assignment record.
``fakegpus``
    ``--fake-gpus``: the ``GpuLibrary`` over a profile, and the device nodes, sysfs and
    MPS control real containers see of it; fenced: only the branches that handle the
    flag import it.
``daemon``
    What every long-running program shares: one bootstrap (flags and DRA_GPU_*
    variables, logging, metrics and probes, signals, start-up errors), health
    tracking, rediscovery, following the own Node, socket helpers.
``kubeletplugin``, ``deviceplugin``, ``labeller``, ``explain``, ``webhook``
    The programs, each with the ``command`` that starts it from the parsed flags.
    Siblings: none imports another.
``cli`` (and ``__main__``)
    The ``dra-gpu`` command line on top: the parser, and the one place that may
    join two programs (the labeller reads the device plugin's config file).
"""

#: The version of everything a release ships, set here and nowhere else: the package's (pyproject.toml
#: reads it), the chart's version and appVersion and so its default image tag (`make manifests` writes
#: them), the `dra_gpu_build_info` metric's label and the daemons' first log line. A commit that
#: changes it is a release (docs/releases.md); tests/unit/test_release_version.py fails on any
#: disagreement.
__version__ = "0.2.0"
