"""The flag groups several subcommands share, and how a parse function becomes a flag's type.

A group is written once so that every command that takes it spells and documents
its flags the same way; each flag is also a DRA_GPU_* variable (dra.daemon.flags).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dra.core.assignment import parse_selector
from dra.core.deviceentries import ShareMode, parse_share_mode
from dra.daemon.flags import (
    boolean,
    directory,
    dns_subdomain,
    file,
    host_program,
    node_name,
    nonempty,
    option,
    path,
    seconds,
)
from dra.daemon.health import APPLICATION_XIDS, parse_xids
from dra.model import migoffer
from dra.model.migmode import DYNAMIC, STATIC, parse_mig_modes

DEFAULT_DRIVER = "gpu.nvidia.com"

T = TypeVar("T")


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse` as an argparse type: its ValueError's message becomes the flag's error, word for word."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


def logging_flags(parser: argparse.ArgumentParser) -> None:
    """--log-level and --log-format, which every command takes."""
    option(parser, "--log-level", "log level", "info", choices=("debug", "info", "warning", "error"))
    option(parser, "--log-format", "log format", "text", choices=("text", "json"))


def parse_consumable_shares(text: str) -> ShareMode | None:
    """--consumable-shares: disabled (None), memory, unlimited or a number of shares."""
    return None if text == "disabled" else parse_share_mode(text)


def default_mig_mode(args: argparse.Namespace) -> None:
    """Fill in --mig-mode when neither the flag nor its variable gave it.

    A fake profile made for dynamic MIG (GPUs in MIG mode, no MIG device made) publishes nothing
    under static MIG, so its name selects dynamic MIG: the profile works on its own.
    """
    if getattr(args, "mig_mode", "") is None:
        args.mig_mode = parse_mig_modes(
            DYNAMIC if _dynamic_profile(getattr(args, "fake_gpus", None)) else STATIC
        )


def _dynamic_profile(fake_gpus: str | None) -> bool:
    if not fake_gpus:
        return False
    # Imported only with --fake-gpus, so that a node with real GPUs never loads the fakes.
    from dra.fakegpus.profiles import DYNAMIC_MIG_PROFILES

    return fake_gpus in DYNAMIC_MIG_PROFILES


def gpu_source_flags(parser: argparse.ArgumentParser) -> None:
    """Where the GPUs come from (NVML or a fake profile, host and driver roots) and how MIG is published."""
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
        "static,@node-a=dynamic,2=dynamic,GPU-...=whole (@node: that node's default); see docs/mig.md; "
        "default static, or dynamic with --fake-gpus naming a profile made for dynamic MIG",
        type=argument_type(parse_mig_modes),
    )
    option(
        parser,
        "--mig-profiles",
        "which MIG profiles dynamic-MIG GPUs offer, at all their placements: common (1g, 2g, 3g and 7g "
        "without media extensions: fewer devices for the scheduler to walk), all, or profile names, "
        "comma-separated (common,4g.40gb); @<node>=<item> replaces them on that node; see docs/mig.md",
        migoffer.DEFAULT,
        type=argument_type(migoffer.parse_mig_offer),
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
        "--nvidia-cdi-hook-path",
        "the node's own nvidia-cdi-hook (NVIDIA container toolkit's, e.g. /usr/bin/nvidia-cdi-hook), which "
        "the CDI specs run to link and cache the driver's libraries in the container; default: the one "
        "this image ships, copied into the plugin directory at start",
        type=host_program,
    )
    option(
        parser,
        "--fake-gpu-root",
        "with --fake-gpus: make the fake GPUs visible to real containers: device nodes under DIR/dev "
        "and a stand-in driver (nvidia-smi -L) under DIR/driver-root, which the CDI specs point at",
        type=directory,
    )


def mig_layout_flags(parser: argparse.ArgumentParser) -> None:
    """The static MIG layout file and the layout of a node without the label."""
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


def assignment_flags(parser: argparse.ArgumentParser) -> None:
    """The GPU split between DRA and the device plugin; give both commands the same values."""
    selector = "all, none, or a comma-separated list of GPU indexes, GPU-/MIG- UUIDs and model=<product name>"
    option(
        parser,
        "--dra-gpus",
        f"GPUs advertised through DRA: {selector}; default: what --device-plugin-gpus leaves "
        "(all when neither is set and this command serves DRA)",
        type=argument_type(parse_selector),
    )
    option(
        parser,
        "--device-plugin-gpus",
        "GPUs advertised through the device plugin (same syntax); default: what --dra-gpus leaves "
        "(all when neither is set and this command is the device plugin)",
        type=argument_type(parse_selector),
    )


def daemon_flags(
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
    logging_flags(parser)
    gpu_source_flags(parser)
    option(parser, "--node-name", node_help, type=node_name, required=node_required)
    option(parser, "--kubelet-root", "the kubelet's root directory", Path("/var/lib/kubelet"), type=directory)
    option(parser, "--cdi-root", cdi_help, Path("/var/run/cdi"), type=directory)
    option(
        parser,
        "--state-dir",
        f"{state_help}; default <kubelet-root>/plugins/<driver-name>",
        type=directory,
    )
    option(
        parser,
        "--fake-gpu-events",
        "with --fake-gpus: file of '<uuid> <xid> [<gpu instance> [<compute instance>]]' lines "
        "to inject XID errors",
        type=file,
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
        type=argument_type(parse_xids),
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
        assignment_flags(parser)
