"""The kubelet plugin's commands: `kubelet-plugin` (the daemon), and `discover`, `time-slices` and
`taint clear`, which show or change on one node what the daemon publishes, sets and marks.

Each turns the parsed flags (dra.cli.parser) into what its code takes, runs it and returns the
exit status; what stops it is a StartupError, which the command line prints as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

import anyio
import yaml

from dra.core import sharing
from dra.core.assignment import parse_selector
from dra.core.deviceentries import SliceError
from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.daemon.bootstrap import (
    StartupError,
    daemon_fields,
    default_state_dir,
    gpu_library,
    load_inventory,
    warn_about_unmatched_mig_modes,
)
from dra.gpu.library import GpuLibrary, GpuLibraryError
from dra.kubeletplugin import healthctl, miglayout, mps, mpsprivsep
from dra.kubeletplugin.daemon import PluginSettings, run_kubelet_plugin
from dra.model.devices import Inventory
from dra.model.migmode import STATIC, MigModes


def kubelet_plugin(args: argparse.Namespace) -> int:
    """`dra-gpu kubelet-plugin`: run the DRA kubelet plugin until SIGTERM or SIGINT."""
    settings = PluginSettings(
        **daemon_fields(args),
        kubeconfig=args.kubeconfig or None,
        unhealthy_taint_effect=args.unhealthy_taint_effect,
        # NVIDIA's --consumable-shares shares every GPU; --shareable-gpus narrows it.
        shareable_gpus=args.shareable_gpus
        or (parse_selector("all") if args.consumable_shares is not None else None),
        share_mode=args.consumable_shares or "memory",
        mps_control=args.mps_control or None,
        mig_config_file=args.mig_config_file,
        mig_config=args.mig_config or None,
        claim_metrics_interval=args.claim_metrics_interval,
        device_metadata=args.device_metadata,
        usage_processes=args.usage_processes,
        usage_procfs=args.usage_procfs,
        usage_max_series=args.usage_max_series,
        vfio=args.vfio,
        instance_id=(args.instance_id or uuid.uuid4().hex) if args.rolling_update else None,
    )
    # Before anything else, while this is the only thread: only the launcher keeps CAP_SYS_ADMIN.
    launcher = mpsprivsep.separate(
        settings.state_directory / "mps", settings.mps_command, mps.COMMAND_TIMEOUT
    )
    # uvloop: chosen while grpc.aio served the kubelet's calls on this loop (docs/testing.md); the calls
    # now run on the gRPC server's threads, the loop keeps the publisher, watches and health.
    anyio.run(run_kubelet_plugin, settings, launcher, backend="asyncio", backend_options={"use_uvloop": True})
    return 0


def discover(args: argparse.Namespace) -> int:
    """`dra-gpu discover`: print the ResourceSlices this node would publish (after a MIG layout's dry run)."""
    lib = gpu_library(args.fake_gpus, args.node_name, host_root=args.host_root, driver_root=args.driver_root)
    modes = args.mig_mode.for_node(args.node_name)
    if args.mig_config_file:
        modes = _dry_run_layout(lib, args, modes)
    inventory = load_inventory(lib, modes)
    warn_about_unmatched_mig_modes(inventory, modes)
    features = ApiFeatures(minor=args.kubernetes_minor, partitionable_devices=True)
    try:
        items = build_slices(
            inventory, args.driver_name, args.node_name, None, generation=1, features=features, vfio=args.vfio
        )
    except SliceError as err:
        raise StartupError(str(err)) from None
    if not any(item["spec"].get("devices") for item in items):
        for line in why_no_device(inventory, modes):
            print(f"no device published: {line}", file=sys.stderr)
    document = {"apiVersion": "v1", "kind": "List", "items": items}
    if args.output == "json":
        print(json.dumps(document, indent=2))
    else:
        print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def why_no_device(inventory: Inventory, modes: MigModes) -> list[str]:
    """Why a node publishes no device, one line per GPU (or one for none)."""
    if not inventory.gpus:
        return ["NVML lists no GPU on this node"]
    lines = []
    for gpu in inventory.gpus:
        mode = modes.of(gpu.index, gpu.uuid)
        if gpu.mig_enabled and mode == STATIC:
            why = (
                "MIG mode is on and it has no MIG device; static MIG publishes only the MIG devices made "
                "beforehand: make some (--mig-config), or offer them per claim with --mig-mode dynamic"
            )
        else:
            why = f"in MIG mode {mode} it offers no device (--mig-profiles may leave none)"
        lines.append(f"GPU {gpu.index} ({gpu.uuid}): {why}")
    return lines


def _dry_run_layout(lib: GpuLibrary, args: argparse.Namespace, modes: MigModes) -> MigModes:
    """The layout's plan on stderr; fake GPUs (kept in memory here) are partitioned, real ones left alone."""
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


def time_slices(args: argparse.Namespace) -> int:
    """`dra-gpu time-slices`: print each GPU's compute time-slice interval."""
    state_dir = args.state_dir or default_state_dir(Path("/var/lib/kubelet"), args.driver_name)
    lib = gpu_library(
        args.fake_gpus,
        args.node_name,
        host_root=args.host_root,
        state_dir=state_dir,
        driver_root=args.driver_root,
    )
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


def clear_taint(args: argparse.Namespace) -> int:
    """`dra-gpu taint clear`: ask the running kubelet plugin to mark a device healthy again."""
    state_dir = args.state_dir or default_state_dir(args.kubelet_root, args.driver_name)
    try:
        print(anyio.run(healthctl.clear, healthctl.socket_path(state_dir), args.device))
    except healthctl.HealthControlError as err:
        print(f"dra-gpu: {args.device} not cleared: {err}", file=sys.stderr)
        return 1
    return 0


def top(args: argparse.Namespace) -> int:
    """`dra-gpu top`: the node's claims and what the driver says of their devices, refreshed."""
    from dra.kubeletplugin import top as view

    try:
        return anyio.run(
            view.run,
            args.kubeconfig or None,
            args.driver_name,
            args.node_name or "",
            args.interval,
            args.once,
            sys.stdout,
            args.metrics_url,
        )
    except KeyboardInterrupt:
        return 0
