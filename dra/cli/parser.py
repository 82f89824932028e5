"""The `dra-gpu` argument parser: every subcommand and its flags, nothing that runs them.

Every flag can also be set by an environment variable DRA_GPU_<FLAG>
(--node-name is DRA_GPU_NODE_NAME), which is how a DaemonSet configures it;
a flag on the command line wins over the variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
from collections.abc import Sequence
from pathlib import Path

from dra import __version__
from dra.cli import options
from dra.cli.options import DEFAULT_DRIVER
from dra.core import taints, versions
from dra.core.assignment import parse_selector
from dra.core.labels import parse_template
from dra.core.usage import DEFAULT_MAX_SERIES
from dra.daemon.flags import (
    UsageError,
    apply_environment,
    boolean,
    csv,
    directory,
    dns_subdomain,
    node_name,
    nonempty,
    option,
    path,
    positive_int,
    seconds,
)
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.allocate import parse_strategies
from dra.deviceplugin.resources import DEFAULT_RESOURCE

#: The kubelet's default node name: the host's name in lower case.
_HOSTNAME = socket.gethostname().lower()

#: Flags that mean something only beside another: (flag, the flag it needs, what for). Checked for
#: every command that takes the flag, so that none of them ignores what another refuses.
NEEDS = (
    ("--mig-config", "--mig-config-file", "it names one of that file's layouts"),
    ("--fake-gpu-root", "--fake-gpus", "it holds the fake GPUs' device nodes and driver"),
    ("--fake-gpu-events", "--fake-gpus", "it injects errors into fake GPUs"),
    ("--config-default", "--config-dir", "it names one of that directory's configs"),
    ("--instance-id", "--rolling-update", "it names the sockets of an instance in a rolling update"),
)
#: Flags that exclude each other: give one.
EXCLUDE = (("--config-file", "--config-dir"),)


def _given(args: argparse.Namespace, flag: str) -> bool:
    """Whether the command takes `flag` and it has a value (command line or variable); false is none."""
    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    return value is not None and value is not False and value != ""


def _check_together(args: argparse.Namespace) -> None:
    """UsageError for flags given without the flag they need, or with one they exclude."""
    for flag, needed, why in NEEDS:
        if (
            hasattr(args, needed.lstrip("-").replace("-", "_"))
            and _given(args, flag)
            and not _given(args, needed)
        ):
            raise UsageError(f"{flag} needs {needed}: {why}")
    for first, second in EXCLUDE:
        if _given(args, first) and _given(args, second):
            raise UsageError(f"{first} and {second} exclude each other: give one")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line, then the DRA_GPU_* values of the subcommand that runs (UsageError)."""
    parser = build_parser()
    args = apply_environment(parser.parse_args(argv))
    _check_together(args)
    options.default_mig_mode(args)
    if hasattr(args, "mig_profiles"):
        # One value for discovery: the modes carry the offer, so every command that reads them has it.
        args.mig_mode = dataclasses.replace(args.mig_mode, offer=args.mig_profiles)
    if args.command == "device-plugin" and args.node_name is None and not args.check_config:
        parser.error("the following arguments are required: --node-name (or env DRA_GPU_NODE_NAME)")
    return args


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="dra-gpu", description="Kubernetes DRA driver for NVIDIA GPUs.")
    parser.add_argument("--version", action="version", version=f"dra-gpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plugin = sub.add_parser(
        "kubelet-plugin", help="run the DRA kubelet plugin (the DaemonSet's main process)"
    )
    options.daemon_flags(
        plugin,
        node_help="this node's name (the DaemonSet sets it from spec.nodeName)",
        cdi_help="directory for CDI spec files the container runtime reads",
        state_help="directory of the checkpoint and of the GPU assignment record",
        http_default=":8080",
    )
    option(plugin, "--kubeconfig", "kubeconfig file; default: the in-cluster service account")
    option(
        plugin,
        "--unhealthy-taint-effect",
        "effect of the taint an unhealthy device gets in the ResourceSlice: NoSchedule keeps new "
        "claims off it, NoExecute also evicts the pods using it",
        taints.Effect.NO_SCHEDULE.value,
        type=options.argument_type(taints.parse_effect),
    )
    option(
        plugin,
        "--shareable-gpus",
        "GPUs published for several claims at once, whole or, in MIG mode, as their MIG devices, "
        "each claim consuming a part (capacity.requests.memory; needs DRAConsumableCapacity): all, "
        "or a list as for --dra-gpus; default: none (every device exclusive)",
        type=options.argument_type(parse_selector),
    )
    option(
        plugin,
        "--consumable-shares",
        "how a shareable device is divided, as NVIDIA's driver's flag of this name: memory (claims ask "
        "capacity.requests.memory in MiB; none asked: the whole device), unlimited (any number of "
        "claims), or N (N equal shares, capacity.requests.shares, 1 by default; with MPS a claim gets "
        "its part of the SMs and memory); disabled. Given without --shareable-gpus it makes every GPU "
        "and MIG device shareable, as NVIDIA's does; default: memory",
        type=options.argument_type(options.parse_consumable_shares),
    )
    option(
        plugin,
        "--mps-control",
        "the nvidia-cuda-mps-control binary that runs a claim's MPS control daemon; default: "
        "nvidia-cuda-mps-control on PATH (with --fake-gpus: the fake one, python -m dra.fakegpus.mpscontrol)",
    )
    option(
        plugin,
        "--vfio",
        "let claims pass whole GPUs through to virtual machines (VfioDeviceConfig, or each GPU's "
        "twin gpu-vfio-<index> of class vfio.gpu.nvidia.com, published where counters are kept): prepare "
        "binds the GPU to vfio-pci through the sysfs under --host-root and unprepare gives it back to "
        "nvidia; off, such claims are refused. Needs an IOMMU and vfio-pci loaded (docs/configuration.md)",
        False,
        type=boolean,
    )
    options.mig_layout_flags(plugin)
    option(
        plugin,
        "--claim-metrics-interval",
        "seconds between samples of dra_gpu_claim_device_info (prepared claims' devices with the pods "
        "and containers using them, labelled to join DCGM's series); 0 disables",
        10.0,
        type=seconds,
    )
    option(
        plugin,
        "--device-metadata",
        "give each claim's containers their devices' attributes in files (KEP-5304): "
        "/var/run/kubernetes.io/dra-device-attributes/.../<driver>-metadata.json, mounted through CDI; "
        "true or false",
        False,
        type=boolean,
    )
    option(
        plugin,
        "--usage-processes",
        "attribute the use of shared GPUs per process: each process NVML lists is mapped to its pod and "
        "container through /proc/<pid>/cgroup (needs the host's PIDs: hostPID) and the node's pods "
        "(needs list on pods); true or false",
        False,
        type=boolean,
    )
    option(
        plugin,
        "--usage-procfs",
        "where the host's /proc is seen, for --usage-processes",
        Path("/proc"),
        type=path,
    )
    option(
        plugin,
        "--usage-max-series",
        "claim usage series kept at most per sample (the rest are counted in "
        "dra_gpu_usage_series_dropped_total)",
        DEFAULT_MAX_SERIES,
        type=positive_int,
    )
    option(
        plugin,
        "--rolling-update",
        "let a new instance start beside the running one (sockets of its own; kubelet 1.33 or newer), "
        "for a DaemonSet update with maxSurge: true or false",
        True,
        type=boolean,
    )
    option(
        plugin,
        "--instance-id",
        "with --rolling-update: this instance's ID in its socket names (the chart passes the pod UID); "
        "default: a random one",
        type=nonempty,
    )

    dp = sub.add_parser(
        "device-plugin",
        help="run the legacy device plugin (nvidia.com/gpu) on the kubelet's device-plugin API",
    )
    options.daemon_flags(
        dp,
        node_help="this node's name (seeds fake UUIDs; use the kubelet-plugin's value)",
        cdi_help="directory for the CDI spec file the container runtime reads",
        state_help="directory of the GPU assignment record shared with the kubelet-plugin",
        http_default=":8081",
        # --check-config needs no node; parse_args asks for it otherwise.
        node_required=False,
    )
    option(
        dp,
        "--device-plugin-dir",
        "the kubelet's device-plugin directory (kubelet.sock); default <kubelet-root>/device-plugins",
        type=path,
    )
    option(
        dp,
        "--resource-name",
        "extended resource of full GPUs (MIG: <domain>/mig-<profile>)",
        DEFAULT_RESOURCE,
        type=nonempty,
    )
    option(
        dp,
        "--device-list-strategy",
        "how allocated devices reach the container: cdi-cri, cdi-annotations, envvar, "
        "or one CDI strategy and envvar; default: the config file's, else cdi-cri",
        type=options.argument_type(parse_strategies),
    )
    option(
        dp,
        "--mig-strategy",
        "MIG devices as resources: none (full GPUs only), single (nvidia.com/gpu means the MIG "
        "devices), mixed (one resource per profile); default: the config file's, else mixed",
        type=options.argument_type(dpconfig.parse_mig_strategy),
    )
    option(
        dp,
        "--config-file",
        "NVIDIA's device-plugin config file (version: v1, YAML or JSON); flags that are set win over it",
        type=path,
    )
    option(
        dp,
        "--config-dir",
        "a directory of named configs (a ConfigMap mounted as a directory, one file per name); the "
        "node's nvidia.com/device-plugin.config label picks one, followed while the plugin runs",
        type=path,
    )
    option(dp, "--config-default", "with --config-dir: the config of a node without the label", type=nonempty)
    option(
        dp,
        "--kubeconfig",
        "with --config-dir: kubeconfig to read the node's labels; default: the in-cluster service account",
    )
    dp.add_argument(
        "--check-config",
        action="store_true",
        help="validate --config-file with the other flags, print the effective settings and exit "
        "(with --fake-gpus, also the resources they would give)",
    )
    option(dp, "--call-log", "append one JSON line per kubelet call to this file (debugging)", type=path)

    labeller = sub.add_parser(
        "node-labeller",
        help="keep GPU Feature Discovery's labels (nvidia.com/gpu.product, ...) on this node's Node",
    )
    options.daemon_flags(
        labeller,
        node_help="this node's name: the Node to label (the DaemonSet sets it from spec.nodeName)",
        cdi_help="unused by this command (accepted so the DaemonSet can set it for every container)",
        state_help="unused by this command",
        http_default=":8082",
        assignment=False,
    )
    option(labeller, "--kubeconfig", "kubeconfig file; default: the in-cluster service account")
    option(
        labeller,
        "--interval",
        "seconds between looks at the GPUs and at the Node's labels (health changes relabel at once)",
        60.0,
        type=seconds,
    )
    option(
        labeller,
        "--mig-strategy",
        "the device plugin's MIG strategy, for nvidia.com/mig.strategy and the MIG labels; default: "
        "the config file's, else none",
        type=options.argument_type(dpconfig.parse_mig_strategy),
    )
    option(
        labeller,
        "--config-file",
        "the device plugin's config file, for the time-slicing labels (gpu.replicas, "
        "gpu.sharing-strategy) and its MIG strategy",
        type=path,
    )
    option(
        labeller,
        "--label-template",
        "extra short labels, comma-separated <key>=<template> with placeholders "
        "(e.g. gpu-type={model},gpu-memory={memoryGiB}gb); see docs/node-labels.md",
        "",
        type=options.argument_type(parse_template),
    )

    taint = sub.add_parser("taint", help="the taints the kubelet-plugin puts on unhealthy devices")
    taint_sub = taint.add_subparsers(dest="taint_command", required=True, metavar="ACTION")
    clear = taint_sub.add_parser(
        "clear",
        help="mark a device healthy again, removing its taint (refused while it still fails); run it "
        "where the kubelet-plugin runs, e.g. kubectl exec into its pod on the node",
    )
    options.logging_flags(clear)
    option(
        clear,
        "--device",
        "the device, as named in the ResourceSlice (gpu-3, or a MIG device's name)",
        type=nonempty,
        required=True,
    )
    option(clear, "--driver-name", "DRA driver name", DEFAULT_DRIVER, dns_subdomain)
    option(clear, "--kubelet-root", "the kubelet's root directory", Path("/var/lib/kubelet"), type=path)
    option(clear, "--state-dir", "the kubelet-plugin's --state-dir", type=path)

    top = sub.add_parser(
        "top", help="a live view of a node's claims: pods, devices (MIG UUIDs), sharing, memory limits"
    )
    options.logging_flags(top)
    option(top, "--kubeconfig", "kubeconfig file; default: the in-cluster service account")
    option(top, "--driver-name", "DRA driver name", DEFAULT_DRIVER)
    option(top, "--node-name", "the node whose claims to show; default: every node's", "")
    option(top, "--interval", "seconds between refreshes", 2.0, type=seconds)
    option(top, "--once", "print the table once and exit", False, type=boolean)
    option(
        top,
        "--metrics-url",
        "the kubelet plugins' /metrics URLs, comma-separated (e.g. http://NODE-IP:8080/metrics): fill the "
        "USED and UTIL columns from the usage they measure; default: those columns show -",
        [],
        type=csv,
    )

    discover = sub.add_parser("discover", help="print the ResourceSlices this node would publish")
    options.logging_flags(discover)
    options.gpu_source_flags(discover)
    option(
        discover,
        "--node-name",
        "node name (pool name; seeds fake UUIDs)",
        _HOSTNAME,
        type=node_name,
    )
    option(discover, "--output", "output format", "yaml", choices=("yaml", "json"))
    options.mig_layout_flags(discover)
    option(
        discover,
        "--kubernetes-minor",
        "the API server's minor release (1.x) to lay dynamic-MIG counters out for: 34 puts them beside "
        "the devices, 35 and later in slices of their own",
        versions.OLDEST_MINOR,
        type=options.argument_type(versions.parse_minor),
    )
    option(
        discover,
        "--vfio",
        "also each GPU's passthrough twin (type vfio), as the kubelet plugin with --vfio=true publishes it",
        False,
        type=boolean,
    )

    slices = sub.add_parser(
        "time-slices", help="print each GPU's compute time-slice interval (fake GPUs: as the driver set it)"
    )
    options.logging_flags(slices)
    options.gpu_source_flags(slices)
    option(slices, "--node-name", "node name (seeds fake UUIDs)", _HOSTNAME, type=node_name)
    option(
        slices,
        "--state-dir",
        "the kubelet-plugin's state directory, where fake GPUs keep their settings; "
        f"default /var/lib/kubelet/plugins/{DEFAULT_DRIVER}",
        type=directory,
    )

    explain = sub.add_parser(
        "explain", help="say, for every device of a node, whether a claim's selectors match, and why not"
    )
    options.logging_flags(explain)
    options.gpu_source_flags(explain)
    option(
        explain,
        "--claim",
        "a ResourceClaim or ResourceClaimTemplate: a YAML file, or NAMESPACE/NAME in the cluster",
    )
    option(
        explain,
        "--device-class",
        "DeviceClasses: YAML files or names in the cluster, comma-separated",
        type=csv,
    )
    option(
        explain,
        "--node-name",
        "the node whose devices to explain (with --fake-gpus: seeds fake UUIDs)",
        type=node_name,
    )
    option(explain, "--kubeconfig", "kubeconfig file; default: the in-cluster service account")
    option(explain, "--output", "output format", "text", choices=("text", "json"))
    webhook = sub.add_parser(
        "webhook",
        help="run the validating admission webhook for this driver's opaque configs (HTTPS POST /validate)",
    )
    options.logging_flags(webhook)
    option(webhook, "--driver-name", "the DRA driver whose configs to check", DEFAULT_DRIVER, dns_subdomain)
    option(webhook, "--bind-address", "host:port of the HTTPS listener", ":8443", type=_host_port)
    option(
        webhook,
        "--tls-cert-file",
        "serving certificate (PEM), reloaded when it changes",
        type=path,
        required=True,
    )
    option(webhook, "--tls-key-file", "its private key (PEM)", type=path, required=True)
    option(
        webhook,
        "--tls-reload-interval",
        "seconds between looks at the certificate files for a rotation; 0 never reloads",
        10.0,
        type=seconds,
    )
    option(webhook, "--http-address", "host:port for /metrics, /healthz and /readyz; empty disables", ":8083")

    schemas = sub.add_parser(
        "api-schema", help="write the JSON Schemas of the configuration API (api/<version>/*.schema.json)"
    )
    options.logging_flags(schemas)
    option(schemas, "--output-dir", "the api/ directory to write them into", Path("api"), type=path)
    return parser


def _host_port(text: str) -> str:
    _, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return text
