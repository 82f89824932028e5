"""The device plugin's settings from its flags and config files, for `dra-gpu device-plugin` and the labeller.

The edge between the command line and the pure config module: it reads the
config file or directory, combines it with the flags that win over it, turns
every problem into a StartupError naming the file and the field, and carries
out `--check-config`.
"""

from __future__ import annotations

from pathlib import Path

from dra import documents
from dra.core.labels import Sharing
from dra.daemon.bootstrap import StartupError, gpu_library, load_inventory
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.configwatch import NamedConfigs
from dra.deviceplugin.resources import DEFAULT_RESOURCE, ResourceError, resources


def load_config(config_file: Path | None, overrides: dpconfig.Overrides) -> dpconfig.Settings:
    """The config file (if any) read and combined with the flags; StartupError naming the problem."""
    parsed = None
    if config_file is not None:
        source = str(config_file)
        try:
            parsed = dpconfig.parse_config(documents.read_file(config_file, "--config-file"), source)
        except (documents.DocumentError, dpconfig.ConfigError) as err:
            raise StartupError(str(err)) from None
    try:
        return dpconfig.effective(parsed, overrides)
    except dpconfig.ConfigError as err:
        raise StartupError(str(err)) from None


def named_configs(
    config_dir: Path | None, default: str | None, overrides: dpconfig.Overrides
) -> NamedConfigs | None:
    """--config-dir and its flags (the command line refuses them beside --config-file, and
    --config-default without them); None without a directory.
    """
    return None if config_dir is None else NamedConfigs(config_dir, default, overrides)


def check_named(named: NamedConfigs) -> int:
    """Validate every config of the directory; print each one's settings."""
    try:
        names = named.names()
        if not names:
            raise StartupError(f"--config-dir: {named.directory} has no config")
        for name in names:
            _, settings = named.read(name)
            print(f"config {name}:")
            print("\n".join(f"  {line}" for line in dpconfig.describe(settings)))
    except dpconfig.ConfigError as err:
        raise StartupError(str(err)) from None
    return 0


def check_config(plugin: dpconfig.Settings, fake_gpus: str | None, node_name: str | None) -> int:
    """Print the settings and, on fake GPUs, the resources the node would offer."""
    print("\n".join(dpconfig.describe(plugin)))
    if not fake_gpus:
        return 0
    inventory = load_inventory(gpu_library(fake_gpus, node_name or "fake-node"))
    try:
        offered = resources(inventory, plugin.resource_name, plugin.mig_strategy, plugin.time_slicing)
    except ResourceError as err:
        raise StartupError(str(err)) from None
    for resource in offered:
        print(f"offers {resource.name}: {resource.advertised}")
    return 0


def labeller_sharing(config_file: Path | None, mig_strategy: dpconfig.MigStrategy | None) -> Sharing:
    """What the node labeller labels after: the device plugin's config file (if any) and its MIG strategy."""
    plugin = load_config(config_file, dpconfig.Overrides(DEFAULT_RESOURCE, mig_strategy))
    # Without a config file the device plugin may not run at all: GFD's default then.
    strategy = mig_strategy or (plugin.mig_strategy if config_file is not None else dpconfig.MigStrategy.NONE)
    return label_sharing(plugin, strategy)


def label_sharing(plugin: dpconfig.Settings, mig_strategy: dpconfig.MigStrategy) -> Sharing:
    """The device plugin's settings as the plain values the labels are computed from."""
    shared = plugin.time_slicing
    mig_prefix = dpconfig.mig_resource_prefix(plugin.resource_name)
    replicas: dict[str, int] = {}
    renamed: set[str] = set()
    for entry in shared.resources:
        short = "gpu" if entry.name == plugin.resource_name else "mig-" + entry.name.removeprefix(mig_prefix)
        replicas[short] = entry.replicas
        if shared.advertised_name(entry) != entry.name:
            renamed.add(short)
    return Sharing(
        mig_strategy=mig_strategy.value,
        strategy="time-slicing" if replicas else "none",
        replicas=replicas,
        renamed=frozenset(renamed),
    )
