"""NVIDIA's device-plugin config file (`version: v1`), read as it is: pure.

`parse_config` turns the file's text into a `ConfigFile` (strict: an unknown
field, a wrong type or a value dra-gpu cannot honour is a ConfigError naming
the field's path). `effective` combines one parsed config with the command
line into the `Settings` the plugin runs with; a file holding several named
configs would pick one and pass it to `effective` the same way.

Flags and DRA_GPU_* variables that are set win over the file, as NVIDIA's
plugin lets its flags and variables win; the file wins over built-in defaults.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra import documents
from dra.deviceplugin.allocate import Strategy, parse_strategies
from dra.model.quoting import quote

VERSION = "v1"
#: The domain NVIDIA's plugin puts before a resource name written without one (`gpu.shared`).
NVIDIA_DOMAIN = "nvidia.com"
SHARED_SUFFIX = ".shared"
#: Each replica is a device ID per GPU that the kubelet lists and checkpoints: 8 GPUs x 1000 is 8000.
MAX_REPLICAS = 1000


class ConfigError(ValueError):
    """A config file dra-gpu cannot run with; the message names the file and the field."""


class MigStrategy(enum.Enum):
    """How MIG devices become extended resources."""

    #: Full GPUs only; GPUs in MIG mode are not offered.
    NONE = "none"
    #: `nvidia.com/gpu` means the MIG devices; every GPU in MIG mode with one profile (or none in MIG mode).
    SINGLE = "single"
    #: One resource per MIG profile (`nvidia.com/mig-3g.40gb`) beside the full GPUs.
    MIXED = "mixed"


DEFAULT_MIG_STRATEGY = MigStrategy.MIXED
DEFAULT_STRATEGIES = frozenset({Strategy.CDI_CRI})


@dataclass(frozen=True)
class SharedResource:
    """One entry of sharing.timeSlicing.resources."""

    name: str
    replicas: int
    rename: str | None = None


@dataclass(frozen=True)
class TimeSlicing:
    """sharing.timeSlicing: which resources are advertised several times per device."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()

    def entry(self, resource: str) -> SharedResource | None:
        """The entry for a resource name, if the file shares it."""
        return next((r for r in self.resources if r.name == resource), None)

    def advertised_name(self, entry: SharedResource) -> str:
        """The name the shared resource is advertised under: `rename`, else `<name>.shared` by default."""
        if entry.rename:
            return entry.rename
        return entry.name + SHARED_SUFFIX if self.rename_by_default else entry.name


@dataclass(frozen=True)
class ConfigFile:
    """One parsed config: None where the file leaves a setting to the flags and defaults."""

    mig_strategy: MigStrategy | None = None
    fail_on_init_error: bool | None = None
    strategies: frozenset[Strategy] | None = None
    time_slicing: TimeSlicing = TimeSlicing()
    #: Fields that were read but change nothing here, each with the reason (the daemon logs them).
    ignored: tuple[str, ...] = ()
    #: Where it came from, for messages.
    source: str = "config"


@dataclass(frozen=True)
class Overrides:
    """What the command line (or DRA_GPU_* variables) set; None where it set nothing."""

    resource_name: str
    mig_strategy: MigStrategy | None = None
    strategies: frozenset[Strategy] | None = None


@dataclass(frozen=True)
class Settings:
    """The effective settings of the plugin."""

    resource_name: str
    mig_strategy: MigStrategy = DEFAULT_MIG_STRATEGY
    fail_on_init_error: bool = True
    strategies: frozenset[Strategy] = DEFAULT_STRATEGIES
    time_slicing: TimeSlicing = TimeSlicing()
    ignored: tuple[str, ...] = ()


class _Reader:
    """Strict reading of one mapping of the file, with the path of every field for messages."""

    def __init__(self, source: str, path: str, value: object, known: set[str]) -> None:
        self.source = source
        self.path = path
        if not isinstance(value, dict):
            raise self.error(f"expected a mapping, got {_kind(value)}")
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            where = ", ".join(self.child(k) for k in unknown)
            raise ConfigError(
                f"{source}: unknown field {where}; allowed in {path or 'the top level'}: "
                f"{', '.join(sorted(known))}"
            )
        self.value: Mapping[str, Any] = value

    def child(self, key: str) -> str:
        """The path of one field."""
        return f"{self.path}.{key}" if self.path else key

    def error(self, message: str, key: str | None = None) -> ConfigError:
        """A ConfigError about this mapping or one of its fields."""
        where = self.child(key) if key is not None else self.path or "the file"
        return ConfigError(f"{self.source}: {where}: {message}")

    def get(self, key: str) -> object:
        """The field's value; None when absent or null."""
        return self.value.get(key)

    def boolean(self, key: str) -> bool | None:
        """A true/false field."""
        value = self.get(key)
        if value is not None and not isinstance(value, bool):
            raise self.error(f"expected true or false, got {_kind(value)}", key)
        return value

    def text(self, key: str) -> str | None:
        """A string field."""
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise self.error(f"expected a string, got {_kind(value)}", key)
        return value

    def mapping(self, key: str, known: set[str]) -> _Reader | None:
        """A nested mapping, read strictly."""
        value = self.get(key)
        return None if value is None else _Reader(self.source, self.child(key), value, known)


def _kind(value: object) -> str:
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else quote(value)


_FLAGS = {
    "migStrategy",
    "failOnInitError",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "gdsEnabled",
    "mofedEnabled",
    "mpsRoot",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "plugin",
    "gfd",
}
_PLUGIN = {
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "containerDriverRoot",
}
_GFD = {"oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"}
_SHARED = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
_RESOURCE = {"name", "rename", "devices", "replicas"}
#: NVIDIA's flags that describe the host or other programs; read, and logged as ignored when set.
_IGNORED: dict[str, str] = {
    "nvidiaDriverRoot": "driver libraries come from the container runtime; device nodes from --host-root",
    "nvidiaDevRoot": "device nodes are looked up under --host-root",
    "mpsRoot": "MPS sharing is not supported",
    "useNodeFeatureAPI": "node labels are not this process's job",
    "gfd": "GPU Feature Discovery settings do not apply to the device plugin",
    "plugin.passDeviceSpecs": "device nodes reach the container through the CDI spec",
    "plugin.cdiAnnotationPrefix": "CDI annotations use the cdi.k8s.io/ prefix",
    "plugin.nvidiaCTKPath": "dra-gpu writes its CDI spec itself",
    "plugin.containerDriverRoot": "driver libraries come from the container runtime",
}
#: NVIDIA's deviceListStrategy values, in dra-gpu's names (volume-mounts has none).
_LIST_STRATEGIES = {"envvar": "envvar", "cdi-cri": "cdi-cri", "cdi-annotations": "cdi-annotations"}


def load_document(text: str | bytes, source: str) -> object:
    """The file's YAML or JSON (JSON is YAML) document, within dra.documents' limits; ConfigError if not."""
    try:
        return documents.load_yaml(text, source)
    except documents.DocumentError as err:
        raise ConfigError(str(err)) from None


def parse_config(text: str | bytes, source: str) -> ConfigFile:
    """Parse one config file's text (`source` names it in messages)."""
    return config_from(load_document(text, source), source)


def config_from(document: object, source: str) -> ConfigFile:
    """A ConfigFile from the loaded document."""
    top = _Reader(source, "", document, {"version", "flags", "resources", "sharing"})
    version = top.text("version")
    if version is not None and version != VERSION:
        raise top.error(f"unsupported version {quote(version)}; dra-gpu reads version {VERSION}", "version")
    if top.get("resources") is not None:
        raise top.error(
            "renaming resources by GPU model is not supported; --resource-name names the GPU resource "
            "(MIG resources follow its domain)",
            "resources",
        )
    ignored: list[str] = []
    flags = top.mapping("flags", _FLAGS)
    mig_strategy = fail_on_init_error = strategies = None
    if flags is not None:
        mig_strategy = _mig_strategy(flags)
        fail_on_init_error = flags.boolean("failOnInitError")
        for key in ("gdsEnabled", "mofedEnabled"):
            if flags.boolean(key):
                raise flags.error(
                    "not supported: dra-gpu does not inject GPUDirect Storage or MOFED devices", key
                )
        discovery = flags.text("deviceDiscoveryStrategy")
        if discovery not in (None, "auto", "nvml"):
            raise flags.error(
                f"{quote(discovery)} is not supported; dra-gpu discovers GPUs through NVML",
                "deviceDiscoveryStrategy",
            )
        flags.mapping("gfd", _GFD)
        plugin = flags.mapping("plugin", _PLUGIN)
        if plugin is not None:
            strategies = _list_strategies(plugin)
            id_strategy = plugin.text("deviceIDStrategy")
            if id_strategy not in (None, "uuid"):
                raise plugin.error(
                    f"{quote(id_strategy)} is not supported: device IDs are UUIDs, "
                    "which survive index changes",
                    "deviceIDStrategy",
                )
        for name, why in _IGNORED.items():
            section, _, key = name.rpartition(".")
            reader = flags.mapping(section, _PLUGIN) if section else flags
            if reader is not None and reader.get(key) not in (None, False):
                ignored.append(f"{reader.child(key)} ({why})")
    sharing = top.mapping("sharing", {"timeSlicing", "mps"})
    time_slicing = TimeSlicing()
    if sharing is not None:
        if sharing.get("mps") is not None:
            raise sharing.error(
                "MPS sharing is not supported; use sharing.timeSlicing, or DRA's MPS sharing", "mps"
            )
        shared = sharing.mapping("timeSlicing", _SHARED)
        if shared is not None:
            time_slicing = _time_slicing(shared)
    return ConfigFile(mig_strategy, fail_on_init_error, strategies, time_slicing, tuple(ignored), source)


def parse_mig_strategy(text: str) -> MigStrategy:
    """none, single or mixed."""
    try:
        return MigStrategy(text)
    except ValueError:
        raise ValueError(f"MIG strategy {quote(text)}: expected none, single or mixed") from None


def _mig_strategy(flags: _Reader) -> MigStrategy | None:
    text = flags.text("migStrategy")
    return None if text is None else _converted(flags, "migStrategy", parse_mig_strategy, text)


def _converted(reader: _Reader, key: str, convert: Callable[[str], Any], text: str) -> Any:
    try:
        return convert(text)
    except ValueError as err:
        raise reader.error(str(err), key) from None


def _list_strategies(plugin: _Reader) -> frozenset[Strategy] | None:
    value = plugin.get("deviceListStrategy")
    if value is None:
        return None
    items: list[object] = value if isinstance(value, list) else [value]
    names = [n for n in items if isinstance(n, str)]
    if not names or len(names) != len(items):
        raise plugin.error("expected a strategy name or a list of them", "deviceListStrategy")
    unsupported = [n for n in names if n not in _LIST_STRATEGIES]
    if unsupported:
        raise plugin.error(
            f"{', '.join(map(quote, unsupported))} not supported; dra-gpu offers envvar, cdi-cri "
            "and cdi-annotations",
            "deviceListStrategy",
        )
    text = ",".join(_LIST_STRATEGIES[n] for n in names)
    strategies: frozenset[Strategy] = _converted(plugin, "deviceListStrategy", parse_strategies, text)
    return strategies


def resource_name(text: str) -> str:
    """A resource name as NVIDIA's file writes it: `gpu.shared` means nvidia.com/gpu.shared."""
    return text if "/" in text else f"{NVIDIA_DOMAIN}/{text}"


def _time_slicing(shared: _Reader) -> TimeSlicing:
    entries = shared.get("resources")
    if entries is not None and not isinstance(entries, list):
        raise shared.error(f"expected a list, got {_kind(entries)}", "resources")
    resources: list[SharedResource] = []
    for i, value in enumerate(entries or ()):
        entry = _Reader(shared.source, f"{shared.child('resources')}[{i}]", value, _RESOURCE)
        name = entry.text("name")
        if not name:
            raise entry.error("required: the resource to share, such as nvidia.com/gpu", "name")
        replicas = entry.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise entry.error(f"must be a whole number of at least 1, got {quote(replicas)}", "replicas")
        if replicas > MAX_REPLICAS:
            raise entry.error(f"at most {MAX_REPLICAS}, got {replicas}", "replicas")
        devices = entry.get("devices")
        if devices not in (None, "all"):
            raise entry.error(
                f"{quote(devices)} is not supported: every device of the resource is shared (devices: all)",
                "devices",
            )
        rename = entry.text("rename")
        item = SharedResource(resource_name(name), replicas, resource_name(rename) if rename else None)
        if any(r.name == item.name for r in resources):
            raise entry.error(f"{item.name} is shared twice", "name")
        resources.append(item)
    return TimeSlicing(
        rename_by_default=bool(shared.boolean("renameByDefault")),
        fail_requests_greater_than_one=bool(shared.boolean("failRequestsGreaterThanOne")),
        resources=tuple(resources),
    )


def mig_resource_prefix(gpu_resource: str) -> str:
    """What every MIG resource name starts with: the GPU resource's domain, then `/mig-`."""
    return gpu_resource.partition("/")[0] + "/mig-"


def effective(config: ConfigFile | None, overrides: Overrides) -> Settings:
    """The settings to run with: a flag that is set, else the file, else the default.

    ConfigError when the file shares a resource this plugin cannot serve: neither
    the GPU resource nor a MIG resource of its domain.
    """
    config = config or ConfigFile()
    prefix = mig_resource_prefix(overrides.resource_name)
    for i, entry in enumerate(config.time_slicing.resources):
        if entry.name != overrides.resource_name and not entry.name.startswith(prefix):
            raise ConfigError(
                f"{config.source}: sharing.timeSlicing.resources[{i}].name: "
                f"unknown resource {quote(entry.name)}; "
                f"this plugin serves {overrides.resource_name} and {prefix}<profile>"
            )
    return Settings(
        resource_name=overrides.resource_name,
        mig_strategy=overrides.mig_strategy or config.mig_strategy or DEFAULT_MIG_STRATEGY,
        fail_on_init_error=True if config.fail_on_init_error is None else config.fail_on_init_error,
        strategies=overrides.strategies or config.strategies or DEFAULT_STRATEGIES,
        time_slicing=config.time_slicing,
        ignored=config.ignored,
    )


def describe(settings: Settings) -> list[str]:
    """The settings as lines for --check-config and the start-up log."""
    lines = [
        f"resource: {settings.resource_name}",
        f"MIG strategy: {settings.mig_strategy.value}",
        f"fail on init error: {json.dumps(settings.fail_on_init_error)}",
        f"device list strategy: {','.join(sorted(s.value for s in settings.strategies))}",
    ]
    shared = settings.time_slicing
    for entry in shared.resources:
        lines.append(
            f"time-slicing: {entry.name} x{entry.replicas} advertised as {shared.advertised_name(entry)}"
            + (", one per container" if shared.fail_requests_greater_than_one and entry.replicas > 1 else "")
        )
    lines.extend(f"ignored: {item}" for item in settings.ignored)
    return lines
