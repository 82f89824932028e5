"""The dra-gpu command line (also `python -m dra`).

Every flag can also be set by an environment variable DRA_GPU_<FLAG>
(--node-name is DRA_GPU_NODE_NAME), which is how a DaemonSet configures it;
a flag on the command line wins over the variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import yaml

from dra.core import sharing, taints, versions
from dra.core.assignment import Selector, SelectorError, parse_selector
from dra.core.labels import AdminTemplate, LabelError, parse_template
from dra.core.slices import SliceError, build_slices
from dra.core.versions import ApiFeatures
from dra.daemon import logs
from dra.daemon.bootstrap import DaemonSettings, StartupError, default_state_dir, gpu_library, load_inventory
from dra.daemon.flags import (
    UsageError,
    apply_environment,
    boolean,
    csv,
    dns_subdomain,
    nonempty,
    option,
    path,
    seconds,
)
from dra.daemon.health import APPLICATION_XIDS, parse_xids
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.allocate import Strategy, parse_strategies
from dra.deviceplugin.resources import DEFAULT_RESOURCE
from dra.gpu.nvml import GpuLibrary, GpuLibraryError
from dra.model import migoffer
from dra.model.migmode import MigModes, parse_mig_modes

DEFAULT_DRIVER = "gpu.nvidia.com"

# Each command imports its program's modules when it runs (in its function below), not here: a
# daemon then loads only its own code, which shortens the kubelet plugin's start and trims its
# memory (docs/architecture.md has the figures).

log = logging.getLogger("dra.cli")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line, then the DRA_GPU_* values of the subcommand that runs (UsageError)."""
    parser = build_parser()
    args = apply_environment(parser.parse_args(argv))
    if hasattr(args, "mig_profiles"):
        # One value for discovery: the modes carry the offer, so every command that reads them has it.
        args.mig_mode = dataclasses.replace(args.mig_mode, offer=args.mig_profiles)
    if args.command == "device-plugin" and args.node_name is None and not args.check_config:
        parser.error("the following arguments are required: --node-name (or env DRA_GPU_NODE_NAME)")
    return args


def _common(parser: argparse.ArgumentParser) -> None:
    option(parser, "--log-level", "log level", "info", choices=("debug", "info", "warning", "error"))
    option(parser, "--log-format", "log format", "text", choices=("text", "json"))


def _gpu_source(parser: argparse.ArgumentParser) -> None:
    option(parser, "--driver-name", "DRA driver name (and attribute domain)", DEFAULT_DRIVER, dns_subdomain)
    option(
        parser,
        "--fake-gpus",
        "fake GPUs instead of NVML: a built-in profile (h100x8, h100x8-mig, a100x4-mig, "
        "h100x8-dynamic-mig, a100x4-dynamic-mig, mixed) or a file",
    )
    option(
        parser,
        "--mig-mode",
        "how GPUs' MIG is published: static (MIG devices made beforehand), dynamic (made per claim "
        "from every profile and placement), whole; then per-GPU overrides by index or UUID, e.g. "
        "static,@node-a=dynamic,2=dynamic,GPU-...=whole (@node: that node's default); see docs/mig.md",
        "static",
        type=_mig_modes,
    )
    option(
        parser,
        "--mig-profiles",
        "which MIG profiles dynamic-MIG GPUs offer, at all their placements: common (1g, 2g, 3g and 7g "
        "without media extensions: fewer devices for the scheduler to walk), all, or profile names, "
        "comma-separated (common,4g.40gb); @<node>=<item> replaces them on that node; see docs/mig.md",
        migoffer.DEFAULT,
        type=_mig_offer,
    )
    option(
        parser,
        "--host-root",
        "where the host's / is mounted: device nodes (/dev/nvidia*) are looked up there, since the "
        "container's own /dev holds only what the runtime injected",
        Path("/"),
        type=path,
    )
    option(
        parser,
        "--driver-root",
        "where the NVIDIA driver's user-space files (libraries, nvidia-smi, firmware) are installed on "
        "the host, e.g. /run/nvidia/driver for NVIDIA's driver container; looked up under --host-root",
        Path("/"),
        type=path,
    )
    option(
        parser,
        "--cdi-driver-files",
        "whether the CDI specs mount the driver's user-space files, so that containers need no NVIDIA "
        "runtime hook; false leaves them to the node's NVIDIA container toolkit (legacy mode)",
        True,
        type=boolean,
    )
    option(
        parser,
        "--fake-gpu-root",
        "with --fake-gpus: make the fake GPUs visible to real containers: device nodes under DIR/dev "
        "and a stand-in driver (nvidia-smi -L) under DIR/driver-root, which the CDI specs point at",
        type=path,
    )


def _mig_layout(parser: argparse.ArgumentParser) -> None:
    option(
        parser,
        "--mig-config-file",
        "static MIG layouts in NVIDIA mig-parted's format (version: v1, mig-configs: {name: [{devices, "
        "mig-enabled, mig-devices}]}), applied to the GPUs at start and whenever the label changes; the "
        "layout is the one the Node's nvidia.com/mig.config label names; see docs/mig.md",
        type=path,
    )
    option(
        parser,
        "--mig-config",
        "with --mig-config-file: the layout for a node without the nvidia.com/mig.config label",
        type=nonempty,
    )


def _selector(text: str) -> Selector:
    try:
        return parse_selector(text)
    except SelectorError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _mig_modes(text: str) -> MigModes:
    try:
        return parse_mig_modes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _mig_offer(text: str) -> migoffer.MigOffer:
    try:
        return migoffer.parse_mig_offer(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _strategies(text: str) -> frozenset[Strategy]:
    try:
        return parse_strategies(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _mig_strategy(text: str) -> dpconfig.MigStrategy:
    try:
        return dpconfig.parse_mig_strategy(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _xids(text: str) -> frozenset[int]:
    try:
        return parse_xids(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _taint_effect(text: str) -> taints.Effect:
    try:
        return taints.parse_effect(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _label_template(text: str) -> AdminTemplate:
    try:
        return parse_template(text)
    except LabelError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _assignment(parser: argparse.ArgumentParser) -> None:
    """The GPU split between DRA and the device plugin; give both commands the same values."""
    selector = "all, none, or a comma-separated list of GPU indexes, GPU-/MIG- UUIDs and model=<product name>"
    option(
        parser,
        "--dra-gpus",
        f"GPUs advertised through DRA: {selector}; default: what --device-plugin-gpus leaves "
        "(all when neither is set and this command serves DRA)",
        type=_selector,
    )
    option(
        parser,
        "--device-plugin-gpus",
        "GPUs advertised through the device plugin (same syntax); default: what --dra-gpus leaves "
        "(all when neither is set and this command is the device plugin)",
        type=_selector,
    )


def _daemon(
    parser: argparse.ArgumentParser,
    *,
    node_help: str,
    cdi_help: str,
    state_help: str,
    http_default: str,
    node_required: bool = True,
    assignment: bool = True,
) -> None:
    """The flags every daemon subcommand shares (dra.daemon.bootstrap.DaemonSettings).

    `assignment`: whether the command takes a share of the GPUs (--dra-gpus, --device-plugin-gpus).
    """
    _common(parser)
    _gpu_source(parser)
    option(parser, "--node-name", node_help, type=nonempty, required=node_required)
    option(parser, "--kubelet-root", "the kubelet's root directory", Path("/var/lib/kubelet"), type=path)
    option(parser, "--cdi-root", cdi_help, Path("/var/run/cdi"), type=path)
    option(
        parser,
        "--state-dir",
        f"{state_help}; default <kubelet-root>/plugins/<driver-name>",
        type=path,
    )
    option(
        parser,
        "--fake-gpu-events",
        "with --fake-gpus: file of '<uuid> <xid> [<gpu instance> [<compute instance>]]' lines "
        "to inject XID errors",
        type=path,
    )
    option(
        parser, "--http-address", "host:port for /metrics, /healthz and /readyz; empty disables", http_default
    )
    option(
        parser,
        "--health-recovery-period",
        "seconds without a critical XID or NVML error after which an unhealthy device is healthy "
        "again; 0 keeps it unhealthy until the driver restarts",
        300.0,
        type=seconds,
    )
    option(
        parser,
        "--ignored-xids",
        "XIDs that leave a device healthy (errors an application causes), comma-separated; replaces "
        "the default, NVIDIA's device plugin's set; empty: every XID marks the device unhealthy",
        ",".join(str(x) for x in sorted(APPLICATION_XIDS)),
        type=_xids,
    )
    if assignment:
        # The node labeller looks at the GPUs every --interval of its own.
        option(
            parser,
            "--rediscover-interval",
            "seconds between looks at the GPUs for changes (MIG layout, lost GPUs); 0 disables",
            60.0,
            type=seconds,
        )
        _assignment(parser)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="dra-gpu", description="Kubernetes DRA driver for NVIDIA GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plugin = sub.add_parser(
        "kubelet-plugin", help="run the DRA kubelet plugin (the DaemonSet's main process)"
    )
    _daemon(
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
        type=_taint_effect,
    )
    option(
        plugin,
        "--shareable-gpus",
        "full GPUs published for several claims at once, each consuming part of the memory "
        "(capacity.requests.memory; needs DRAConsumableCapacity): all, or a list as for --dra-gpus; "
        "default: none (every GPU exclusive)",
        type=_selector,
    )
    option(
        plugin,
        "--mps-control",
        "the nvidia-cuda-mps-control binary that runs a claim's MPS control daemon; default: "
        "nvidia-cuda-mps-control on PATH (with --fake-gpus: the fake one, python -m dra.gpu.fakemps)",
    )
    _mig_layout(plugin)
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
    _daemon(
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
        type=_strategies,
    )
    option(
        dp,
        "--mig-strategy",
        "MIG devices as resources: none (full GPUs only), single (nvidia.com/gpu means the MIG "
        "devices), mixed (one resource per profile); default: the config file's, else mixed",
        type=_mig_strategy,
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
    _daemon(
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
        type=_mig_strategy,
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
        type=_label_template,
    )

    taint = sub.add_parser("taint", help="the taints the kubelet-plugin puts on unhealthy devices")
    taint_sub = taint.add_subparsers(dest="taint_command", required=True, metavar="ACTION")
    clear = taint_sub.add_parser(
        "clear",
        help="mark a device healthy again, removing its taint (refused while it still fails); run it "
        "where the kubelet-plugin runs, e.g. kubectl exec into its pod on the node",
    )
    _common(clear)
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

    discover = sub.add_parser("discover", help="print the ResourceSlices this node would publish")
    _common(discover)
    _gpu_source(discover)
    option(
        discover,
        "--node-name",
        "node name (pool name; seeds fake UUIDs)",
        socket.gethostname(),
        type=nonempty,
    )
    option(discover, "--output", "output format", "yaml", choices=("yaml", "json"))
    _mig_layout(discover)
    option(
        discover,
        "--kubernetes-minor",
        "the API server's minor release (1.x) to lay dynamic-MIG counters out for: 34 puts them beside "
        "the devices, 35 and later in slices of their own",
        versions.OLDEST_MINOR,
        type=int,
    )

    slices = sub.add_parser(
        "time-slices", help="print each GPU's compute time-slice interval (fake GPUs: as the driver set it)"
    )
    _common(slices)
    _gpu_source(slices)
    option(slices, "--node-name", "node name (seeds fake UUIDs)", socket.gethostname(), type=nonempty)
    option(
        slices,
        "--state-dir",
        "the kubelet-plugin's state directory, where fake GPUs keep their settings; "
        f"default /var/lib/kubelet/plugins/{DEFAULT_DRIVER}",
        type=path,
    )

    explain = sub.add_parser(
        "explain", help="say, for every device of a node, whether a claim's selectors match, and why not"
    )
    _common(explain)
    _gpu_source(explain)
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
    option(explain, "--node-name", "the node whose devices to explain (with --fake-gpus: seeds fake UUIDs)")
    option(explain, "--kubeconfig", "kubeconfig file; default: the in-cluster service account")
    option(explain, "--output", "output format", "text", choices=("text", "json"))
    webhook = sub.add_parser(
        "webhook",
        help="run the validating admission webhook for this driver's opaque configs (HTTPS POST /validate)",
    )
    _common(webhook)
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
    _common(schemas)
    option(schemas, "--output-dir", "the api/ directory to write them into", Path("api"), type=path)
    return parser


def _host_port(text: str) -> str:
    _, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return text


def _webhook(args: argparse.Namespace) -> int:
    from dra.webhook.server import WebhookSettings, run_webhook

    settings = WebhookSettings(
        driver_name=args.driver_name,
        bind_address=args.bind_address,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        http_address=args.http_address or None,
        tls_reload_interval=args.tls_reload_interval,
    )
    anyio.run(run_webhook, settings, backend="asyncio")
    return 0


def _api_schema(args: argparse.Namespace) -> int:
    from dra.api import schema

    for name, text in schema.documents().items():
        target = args.output_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
    return 0


def _discover(args: argparse.Namespace) -> int:
    lib = gpu_library(args.fake_gpus, args.node_name)
    modes = args.mig_mode.for_node(args.node_name)
    if args.mig_config_file:
        modes = _dry_run_layout(lib, args, modes)
    inventory = load_inventory(lib, modes)
    features = ApiFeatures(minor=args.kubernetes_minor, partitionable_devices=True)
    try:
        items = build_slices(
            inventory, args.driver_name, args.node_name, None, generation=1, features=features
        )
    except SliceError as err:
        raise StartupError(str(err)) from None
    document = {"apiVersion": "v1", "kind": "List", "items": items}
    if args.output == "json":
        print(json.dumps(document, indent=2))
    else:
        print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def _dry_run_layout(lib: GpuLibrary, args: argparse.Namespace, modes: MigModes) -> MigModes:
    """The layout's plan on stderr; fake GPUs (kept in memory here) are partitioned, real ones left alone."""
    from dra.daemon import miglayout

    if not args.mig_config:
        raise StartupError("--mig-config-file: name the layout to show with --mig-config")
    configs = miglayout.load_configs(args.mig_config_file)
    try:
        lib.init()
    except GpuLibraryError as err:
        raise StartupError(f"cannot read GPUs through NVML: {err}") from None
    applied = miglayout.apply_layout(lib, configs, args.mig_config, set(), modes, dry_run=not args.fake_gpus)
    print(f"MIG layout {args.mig_config!r} of {args.mig_config_file}:", file=sys.stderr)
    for plan in applied.plans:
        print(f"  {plan.describe()}", file=sys.stderr)
    for warning in applied.warnings:
        print(f"  warning: {warning}", file=sys.stderr)
    return miglayout.static_modes(modes, applied)


def _time_slices(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir(Path("/var/lib/kubelet"), args.driver_name)
    lib = gpu_library(args.fake_gpus, args.node_name, host_root=args.host_root, state_dir=state_dir)
    inventory = load_inventory(lib)
    names = {level: name for name, level in sharing.INTERVAL_LEVELS.items()}
    try:
        for gpu in inventory.gpus:
            try:
                level = lib.time_slice(lib.device_by_index(gpu.index))
                shown = names.get(level, str(level))
            except GpuLibraryError as err:
                shown = f"unknown ({err})"
            print(f"{gpu.index}\t{gpu.uuid}\t{shown}")
    finally:
        lib.shutdown()
    return 0


def _daemon_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The DaemonSettings fields, from the flags every daemon shares."""
    return {
        "driver_name": args.driver_name,
        "node_name": args.node_name,
        "kubelet_root": args.kubelet_root,
        "cdi_root": args.cdi_root,
        "state_dir": args.state_dir,
        "fake_gpus": args.fake_gpus or None,
        "fake_gpu_events": args.fake_gpu_events,
        "http_address": args.http_address or None,
        "dra_gpus": getattr(args, "dra_gpus", None),
        "device_plugin_gpus": getattr(args, "device_plugin_gpus", None),
        "host_root": args.host_root,
        "driver_root": args.driver_root,
        "cdi_driver_files": args.cdi_driver_files,
        "fake_gpu_root": args.fake_gpu_root,
        "health_recovery_period": args.health_recovery_period,
        "ignored_xids": args.ignored_xids,
        "rediscover_interval": getattr(args, "rediscover_interval", DaemonSettings.rediscover_interval),
        "mig_modes": args.mig_mode.for_node(args.node_name or ""),
    }


def _kubelet_plugin(args: argparse.Namespace) -> int:
    from dra.kubeletplugin.daemon import PluginSettings, run_kubelet_plugin

    if args.mig_config and not args.mig_config_file:
        raise StartupError("--mig-config names a layout of --mig-config-file, which is not set")
    settings = PluginSettings(
        **_daemon_settings(args),
        kubeconfig=args.kubeconfig or None,
        unhealthy_taint_effect=args.unhealthy_taint_effect,
        shareable_gpus=args.shareable_gpus,
        mps_control=args.mps_control or None,
        mig_config_file=args.mig_config_file,
        mig_config=args.mig_config or None,
        instance_id=(args.instance_id or uuid.uuid4().hex) if args.rolling_update else None,
    )
    anyio.run(run_kubelet_plugin, settings, backend="asyncio")
    return 0


def _taint(args: argparse.Namespace) -> int:
    from dra.daemon import healthctl

    state_dir = args.state_dir or default_state_dir(args.kubelet_root, args.driver_name)
    try:
        print(anyio.run(healthctl.clear, healthctl.socket_path(state_dir), args.device))
    except healthctl.HealthControlError as err:
        print(f"dra-gpu: {args.device} not cleared: {err}", file=sys.stderr)
        return 1
    return 0


def _device_plugin(args: argparse.Namespace) -> int:
    from dra.deviceplugin import setup as dpsetup
    from dra.deviceplugin.daemon import DevicePluginSettings, run_device_plugin

    overrides = dpconfig.Overrides(args.resource_name, args.mig_strategy, args.device_list_strategy)
    named = dpsetup.named_configs(args.config_dir, args.config_default, args.config_file, overrides)
    if named is not None and args.check_config:
        return dpsetup.check_named(named)
    plugin = dpsetup.load_config(args.config_file, overrides)
    if args.check_config:
        return dpsetup.check_config(plugin, args.fake_gpus, args.node_name)
    for item in plugin.ignored:
        log.info("%s: ignored %s", args.config_file, item)
    settings = DevicePluginSettings(
        **_daemon_settings(args),
        device_plugin_dir=args.device_plugin_dir,
        resource_name=plugin.resource_name,
        strategies=plugin.strategies,
        call_log=args.call_log,
        mig_strategy=plugin.mig_strategy,
        time_slicing=plugin.time_slicing,
        fail_on_init_error=plugin.fail_on_init_error,
        named=named,
        kubeconfig=args.kubeconfig or None,
    )
    anyio.run(run_device_plugin, settings, backend="asyncio")
    return 0


def _node_labeller(args: argparse.Namespace) -> int:
    from dra.deviceplugin import setup as dpsetup
    from dra.labeller.daemon import LabellerSettings, run_node_labeller

    plugin = dpsetup.load_config(args.config_file, dpconfig.Overrides(DEFAULT_RESOURCE, args.mig_strategy))
    # Without a config file the device plugin may not run at all: GFD's default then.
    mig_strategy = args.mig_strategy or (
        plugin.mig_strategy if args.config_file is not None else dpconfig.MigStrategy.NONE
    )
    settings = LabellerSettings(
        **_daemon_settings(args),
        kubeconfig=args.kubeconfig or None,
        interval=args.interval,
        sharing=dpsetup.label_sharing(plugin, mig_strategy),
        admin=args.label_template,
    )
    anyio.run(run_node_labeller, settings, backend="asyncio")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from dra.explain import command as explaincmd

    if args.fake_gpus and not args.node_name:
        args.node_name = "fake-node"
    return explaincmd.run(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "kubelet-plugin": _kubelet_plugin,
    "device-plugin": _device_plugin,
    "node-labeller": _node_labeller,
    "discover": _discover,
    "webhook": _webhook,
    "api-schema": _api_schema,
    "taint": _taint,
    "time-slices": _time_slices,
    "explain": _explain,
}


def _first_startup_error(group: BaseExceptionGroup[BaseException]) -> StartupError | None:
    matched = group.subgroup(StartupError)
    while matched is not None:
        first = matched.exceptions[0]
        if isinstance(first, StartupError):
            return first
        matched = first.subgroup(StartupError) if isinstance(first, BaseExceptionGroup) else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; the exit status (1 with one line on stderr for a startup error, 2 for a MIG layout)."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"dra-gpu: error: {err}", file=sys.stderr)
        return 2
    logs.setup(args.log_level, args.log_format)
    try:
        return COMMANDS[args.command](args)
    except (StartupError, ExceptionGroup) as err:
        # A start-up step that runs inside a task group arrives wrapped in an ExceptionGroup.
        found = err if isinstance(err, StartupError) else _first_startup_error(err)
        if found is None:
            raise
        print(f"dra-gpu: error: {found}", file=sys.stderr)
        return found.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (| head) went away; say nothing more on a closed stdout.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
