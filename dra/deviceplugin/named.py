"""Named configs: one of several config files, chosen per node by a Node label, as NVIDIA's plugin does.

A ConfigMap with one key per config, mounted as a directory, gives one file
per name. The node's `nvidia.com/device-plugin.config` label names the config
in force; without the label, the default name (or the only config) is used.
Pure: the caller lists the directory and reads the labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dra.deviceplugin.config import ConfigError

#: The Node label that names the config of a node (NVIDIA's name).
LABEL = "nvidia.com/device-plugin.config"


def config_names(file_names: Iterable[str]) -> list[str]:
    """The config names among a directory's file names, sorted.

    Names starting with a dot are left out: a mounted ConfigMap keeps its
    versions in `..data` and `..<timestamp>` beside the keys.
    """
    return sorted(name for name in file_names if not name.startswith("."))


def choose(labels: Mapping[str, str], names: Iterable[str], default: str | None) -> str:
    """The config name for a node with these labels; ConfigError naming what is missing."""
    available = list(names)
    listed = ", ".join(available) or "none"
    wanted = labels.get(LABEL)
    if wanted:
        if wanted not in available:
            raise ConfigError(f"node label {LABEL}={wanted} names no config (have {listed})")
        return wanted
    if default:
        if default not in available:
            raise ConfigError(f"--config-default {default} names no config (have {listed})")
        return default
    if len(available) == 1:
        return available[0]
    raise ConfigError(
        f"the node has no {LABEL} label and there is no --config-default to fall back on (configs: {listed})"
    )
