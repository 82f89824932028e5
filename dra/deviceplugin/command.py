"""`dra-gpu device-plugin`: the parsed flags and NVIDIA's config file or directory, then the daemon.

`--check-config` validates the config with the flags, prints the effective settings and exits
instead of serving (dra.deviceplugin.setup does the reading and the checking).
"""

from __future__ import annotations

import argparse
import logging

import anyio

from dra.daemon.bootstrap import daemon_fields
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin import setup as dpsetup
from dra.deviceplugin.daemon import DevicePluginSettings, run_device_plugin

log = logging.getLogger(__name__)


def device_plugin(args: argparse.Namespace) -> int:
    """Run the device plugin until SIGTERM or SIGINT (or check its config); the exit status."""
    overrides = dpconfig.Overrides(args.resource_name, args.mig_strategy, args.device_list_strategy)
    named = dpsetup.named_configs(args.config_dir, args.config_default, overrides)
    if named is not None and args.check_config:
        return dpsetup.check_named(named)
    plugin = dpsetup.load_config(args.config_file, overrides)
    if args.check_config:
        return dpsetup.check_config(plugin, args.fake_gpus, args.node_name)
    for item in plugin.ignored:
        log.info("%s: ignored %s", args.config_file, item)
    settings = DevicePluginSettings(
        **daemon_fields(args),
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
