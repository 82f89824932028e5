"""Following the node's named config while the plugin runs (--config-dir).

The plugin watches its own Node: when the `nvidia.com/device-plugin.config`
label names another config, or the file of the config in force changes, the
new config is validated and applied in place. One that cannot be read, parsed
or offered is refused: the last good config stays in force, and the reason
goes to the log and to a Warning Event on the Node.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio

from dra import documents
from dra.adapters.kube import KubeClient, KubeError, Obj
from dra.daemon.nodewatch import follow_node, labels_of
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.named import LABEL, choose, config_names

log = logging.getLogger(__name__)

#: The reason of the Event recorded on the Node for a refused config.
REFUSED = "DevicePluginConfigRefused"


@dataclass(frozen=True)
class NamedConfigs:
    """A directory of named configs, a default name, and the flags that win over every config."""

    directory: Path
    default: str | None
    overrides: dpconfig.Overrides

    def names(self) -> list[str]:
        """The names of the configs in the directory; ConfigError when it cannot be listed."""
        try:
            return config_names(p.name for p in self.directory.iterdir())
        except OSError as err:
            raise dpconfig.ConfigError(f"--config-dir: cannot list {self.directory}: {err}") from None

    def chosen(self, labels: Mapping[str, str]) -> tuple[str, str]:
        """The name and text of the config these labels choose; ConfigError why there is none."""
        name = choose(labels, self.names(), self.default)
        return name, self.text(name)

    def text(self, name: str) -> str:
        """One config's text; ConfigError naming it when it cannot be read."""
        path = self.directory / name
        try:
            return documents.read_text(path, f"config {name}")
        except documents.DocumentError as err:
            raise dpconfig.ConfigError(str(err)) from None

    def read(self, name: str) -> tuple[str, dpconfig.Settings]:
        """The text and effective settings of one config; ConfigError naming it and the problem."""
        text = self.text(name)
        return text, self.settings(name, text)

    def load(self, labels: Mapping[str, str]) -> tuple[str, str, dpconfig.Settings]:
        """The name, text and effective settings of the config these labels choose; ConfigError why not."""
        name, text = self.chosen(labels)
        return name, text, self.settings(name, text)

    def settings(self, name: str, text: str) -> dpconfig.Settings:
        """One config's text combined with the flags; ConfigError naming the config and the problem."""
        parsed = dpconfig.parse_config(text, f"config {name} ({self.directory / name})")
        settings = dpconfig.effective(parsed, self.overrides)
        for item in settings.ignored:
            log.info("config %s: ignored %s", name, item)
        return settings


class ConfigFollower:
    """Applies the config the Node's label names, again whenever the label or the file changes."""

    def __init__(
        self,
        configs: NamedConfigs,
        kube: KubeClient,
        node_name: str,
        apply: Callable[[dpconfig.Settings], Awaitable[str | None]],
        in_force: tuple[str, str],
        poll_interval: float = 1.0,
    ) -> None:
        self._configs = configs
        self._kube = kube
        self._node_name = node_name
        self._apply = apply
        #: (name, text) of the config in force.
        self.in_force = in_force
        #: (name, text) last considered, so that one refusal is reported once.
        self._seen = in_force
        self._poll_interval = poll_interval
        self._node: Obj | None = None

    async def consider(self, node: Obj) -> None:
        """Apply the config this Node state chooses, if it is not the one in force."""
        self._node = node
        try:
            name, text = self._configs.chosen(labels_of(node))
        except dpconfig.ConfigError as err:
            await self._refuse(("", str(err)), str(err))
            return
        # Polled every second: parse (and log what it ignores) only a config not seen yet.
        if (name, text) == self._seen:
            return
        try:
            settings = self._configs.settings(name, text)
        except dpconfig.ConfigError as err:
            await self._refuse(("", str(err)), str(err))
            return
        refused = await self._apply(settings)
        if refused is not None:
            await self._refuse((name, text), f"config {name}: {refused}")
            return
        self._seen = self.in_force = (name, text)
        log.info("config %s in force (%s=%s)", name, LABEL, labels_of(node).get(LABEL, "unset"))

    async def _refuse(self, seen: tuple[str, str], reason: str) -> None:
        if seen == self._seen:
            return
        self._seen = seen
        message = f"{reason}; keeping config {self.in_force[0]}"
        log.error("ignored a new device-plugin config: %s", message)
        if self._node is None:
            return
        try:
            await self._kube.create_event(self._node, REFUSED, message, host=self._node_name)
        except KubeError as err:
            log.warning("cannot record an event on Node %s: %s", self._node_name, err)

    async def run(self) -> None:
        """Watch the Node and poll the config file, until cancelled."""
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch)
            group.start_soon(self._poll)

    async def _poll(self) -> None:
        # A mounted ConfigMap changes without a Node event: look at the file now and then.
        while True:
            await anyio.sleep(self._poll_interval)
            if self._node is not None:
                await self.consider(self._node)

    async def _watch(self) -> None:
        await follow_node(self._kube, self._node_name, self.consider)
