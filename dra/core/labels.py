"""Node labels in the form of NVIDIA's GPU Feature Discovery (GFD), and an optional short admin scheme.

Pure: the inventory, the unhealthy devices and the sharing settings in, a label map out; the
labeller writes it and removes the labels of `owned` keys the map no longer holds, leaving every
other label alone. Where GFD's behaviour does not carry over (several models, unhealthy devices,
strategy `single` on a layout it cannot serve, profile names a key cannot hold), the choices are
docs/node-labels.md's.
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from dra.model.devices import Gpu, Inventory, MigDevice

PREFIX = "nvidia.com/"

#: Label keys this module writes that do not depend on the inventory's MIG profiles.
_STATIC = (
    "gpu.present",
    "gpu.product",
    "gpu.memory",
    "gpu.count",
    "gpu.replicas",
    "gpu.sharing-strategy",
    "gpu.family",
    "gpu.compute.major",
    "gpu.compute.minor",
    "gpu.multiprocessors",
    "gpu.slices.gi",
    "gpu.slices.ci",
    "gpu.engines.copy",
    "gpu.engines.decoder",
    "gpu.engines.encoder",
    "gpu.engines.jpeg",
    "gpu.engines.ofa",
    "cuda.driver.major",
    "cuda.driver.minor",
    "cuda.driver.rev",
    "cuda.driver-version.full",
    "cuda.driver-version.major",
    "cuda.driver-version.minor",
    "cuda.driver-version.revision",
    "cuda.runtime.major",
    "cuda.runtime.minor",
    "cuda.runtime-version.full",
    "cuda.runtime-version.major",
    "cuda.runtime-version.minor",
    "mig.strategy",
)
STATIC_KEYS = frozenset(PREFIX + key for key in _STATIC)
_MIG_SUFFIXES = (
    "count",
    "memory",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
)
#: The keys of each MIG profile's labels (the chart's node policy allows exactly these and STATIC_KEYS).
MIG_KEY = re.compile(
    "^"
    + re.escape(PREFIX)
    + r"mig-[A-Za-z0-9][-A-Za-z0-9_.]*\.("
    + "|".join(map(re.escape, _MIG_SUFFIXES))
    + ")$"
)
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: Kubernetes' limit on a DNS subdomain (RFC 1123), and the shorter one on a DRA driver's name
#: (resource.k8s.io's DriverNameMaxLength, the same as CSI's).
MAX_SUBDOMAIN = 253
MAX_DRIVER_NAME = 63
_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")
#: "3g.40gb" and "1c.3g.40gb": the compute-instance and GPU-instance slices.
_PROFILE_SLICES = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")
#: Words NVIDIA puts before the model in product names; the short model leaves them out.
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
MAX_VALUE = 63

SHARING_STRATEGIES = ("none", "time-slicing", "mps")
MIG_STRATEGIES = ("none", "single", "mixed")


def is_dns_subdomain(text: str, limit: int = MAX_SUBDOMAIN) -> bool:
    """Whether `text` is a DNS subdomain as Kubernetes checks one (RFC 1123, at most `limit` long)."""
    # fullmatch: `$` would let a trailing newline through.
    return len(text) <= limit and _DNS_SUBDOMAIN.fullmatch(text) is not None


class LabelError(ValueError):
    """A label key, value or template that Kubernetes would refuse; the message says which."""


@dataclass(frozen=True)
class Sharing:
    """How the device plugin shares the node's resources (plain values; defaults where only DRA runs).

    `replicas` and `renamed` are keyed by the resource's short name: `gpu`, or
    `mig-<profile>`; a resource that is absent is not shared.
    """

    mig_strategy: str = "none"
    strategy: str = "none"
    replicas: Mapping[str, int] = field(default_factory=dict)
    #: Shared resources advertised under a new name (GFD then leaves `-SHARED` off the product).
    renamed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.mig_strategy not in MIG_STRATEGIES:
            raise LabelError(
                f"unknown MIG strategy {self.mig_strategy!r}; use one of {', '.join(MIG_STRATEGIES)}"
            )
        if self.strategy not in SHARING_STRATEGIES:
            raise LabelError(
                f"unknown sharing strategy {self.strategy!r}; use one of {', '.join(SHARING_STRATEGIES)}"
            )


def label_value(text: str) -> str:
    """`text` as a label value GFD would write: spaces and other illegal characters as `-`, cut to 63."""
    return _NOT_IN_LABEL.sub("-", text.strip())[:MAX_VALUE].strip("-_.")


def check_value(key: str, value: str) -> str:
    """`value` if Kubernetes accepts it as the value of label `key`, else LabelError."""
    if len(value) > MAX_VALUE or not _VALUE.match(value):
        raise LabelError(
            f"label {key}: value {value!r} is not a valid label value (at most {MAX_VALUE} characters "
            "of A-Z, a-z, 0-9, '-', '_' and '.', beginning and ending with a letter or digit)"
        )
    return value


def check_key(key: str) -> str:
    """`key` if Kubernetes accepts it as a label key ([prefix/]name), else LabelError."""
    prefix, sep, name = key.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        raise LabelError(f"label key {key!r}: the prefix {prefix!r} is not a DNS subdomain")
    if len(name) > MAX_VALUE or not _NAME.match(name):
        raise LabelError(
            f"label key {key!r}: the name {name!r} must be at most {MAX_VALUE} characters of A-Z, a-z, "
            "0-9, '-', '_' and '.', beginning and ending with a letter or digit"
        )
    return key


def owned(key: str, admin_keys: Collection[str] = ()) -> bool:
    """Whether the labeller writes label `key` (and so may remove it): GFD's keys and the admin scheme's."""
    return key in STATIC_KEYS or bool(MIG_KEY.match(key)) or key in admin_keys


def main_model(gpus: Iterable[Gpu]) -> Gpu | None:
    """The first GPU of the model most GPUs have (ties: the model of the lowest index); None without GPUs."""
    ordered = sorted(gpus, key=lambda g: g.index)
    counts: dict[str, int] = {}
    for gpu in ordered:
        counts[gpu.product_name] = counts.get(gpu.product_name, 0) + 1
    if not ordered:
        return None
    best = max(counts.values())
    return next(g for g in ordered if counts[g.product_name] == best)


def short_model(product_name: str) -> str:
    """The model without vendor words, lower case: "NVIDIA H100 80GB HBM3" -> "h100", "Tesla T4" -> "t4"."""
    words = [w for w in product_name.split() if w.lower() not in _VENDOR_WORDS]
    return label_value(words[0].lower()) if words else ""


def _version_parts(version: str) -> list[str]:
    return [*version.split("."), "0", "0"][:3]


def _product(gpu: Gpu, sharing: Sharing, resource: str, suffix: str = "") -> str:
    product = label_value(gpu.product_name + suffix)
    if resource in sharing.replicas and resource not in sharing.renamed:
        product = label_value(product[: MAX_VALUE - len("-SHARED")] + "-SHARED")
    return product


def _sharing_labels(sharing: Sharing, resource: str, key: str) -> dict[str, str]:
    replicas = sharing.replicas.get(resource)
    return {
        f"{key}.replicas": str(replicas or 1),
        f"{key}.sharing-strategy": sharing.strategy if replicas else "none",
    }


def _mig_shape(mig: MigDevice, key: str) -> dict[str, str]:
    slices = _PROFILE_SLICES.match(mig.profile)
    gi = slices.group(2) if slices else "0"
    ci = (slices.group(1) or gi) if slices else "0"
    return {
        f"{key}.memory": str(mig.memory_bytes // (1024 * 1024)),
        f"{key}.multiprocessors": str(mig.engines.multiprocessors),
        f"{key}.slices.gi": gi,
        f"{key}.slices.ci": ci,
        f"{key}.engines.copy": str(mig.engines.copy_engines),
        f"{key}.engines.decoder": str(mig.engines.decoders),
        f"{key}.engines.encoder": str(mig.engines.encoders),
        f"{key}.engines.jpeg": str(mig.engines.jpeg_engines),
        f"{key}.engines.ofa": str(mig.engines.ofa_engines),
    }


def _single_profile(inventory: Inventory) -> list[MigDevice] | None:
    """The MIG devices when every GPU is in MIG mode with devices of one profile; else None."""
    if not inventory.gpus or not all(g.mig_enabled for g in inventory.gpus):
        return None
    migs = [d for d in inventory if isinstance(d, MigDevice)]
    with_migs = {m.parent.uuid for m in migs}
    if len({m.profile for m in migs}) != 1 or any(g.uuid not in with_migs for g in inventory.gpus):
        return None
    return migs


def gfd_labels(
    inventory: Inventory, unhealthy: Collection[str] = (), sharing: Sharing | None = None
) -> dict[str, str]:
    """GFD's labels for the node's GPUs (every GPU, whichever path advertises it); {} without GPUs.

    `unhealthy` names devices left out of the counts.
    """
    sharing = sharing or Sharing()
    if not inventory.gpus:
        return {}
    labels: dict[str, str] = {"gpu.present": "true", "mig.strategy": sharing.mig_strategy}
    driver = inventory.driver_version
    if driver:
        major, minor, rev = _version_parts(driver)
        labels.update({"cuda.driver.major": major, "cuda.driver.minor": minor, "cuda.driver.rev": rev})
        labels.update(
            {
                "cuda.driver-version.full": driver,
                "cuda.driver-version.major": major,
                "cuda.driver-version.minor": minor,
                "cuda.driver-version.revision": rev,
            }
        )
    cuda_major, cuda_minor, _ = _version_parts(inventory.cuda_driver_version)
    labels.update(
        {
            "cuda.runtime.major": cuda_major,
            "cuda.runtime.minor": cuda_minor,
            "cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
            "cuda.runtime-version.major": cuda_major,
            "cuda.runtime-version.minor": cuda_minor,
        }
    )
    healthy = [d for d in inventory if d.name not in unhealthy]
    single = _single_profile(inventory) if sharing.mig_strategy == "single" else None
    if single is not None:
        first = single[0]
        labels.update(_mig_shape(first, "gpu"))
        labels["gpu.product"] = _product(first.parent, sharing, "gpu", f"-MIG-{first.profile}")
        labels["gpu.count"] = str(sum(1 for d in healthy if isinstance(d, MigDevice)))
    else:
        whole = [g for g in inventory.gpus if not g.mig_enabled] or list(inventory.gpus)
        model = main_model(whole)
        assert model is not None  # inventory.gpus is not empty
        labels["gpu.product"] = _product(model, sharing, "gpu")
        labels["gpu.memory"] = str(model.memory_bytes // (1024 * 1024))
        labels["gpu.count"] = str(sum(1 for d in healthy if isinstance(d, Gpu)))
    model = main_model(inventory.gpus)
    assert model is not None
    compute = _version_parts(model.cuda_compute_capability)
    labels.update(
        {
            "gpu.family": label_value(model.architecture.lower()),
            "gpu.compute.major": compute[0],
            "gpu.compute.minor": compute[1],
        }
    )
    labels.update(_sharing_labels(sharing, "gpu", "gpu"))
    if sharing.mig_strategy == "mixed":
        by_profile: dict[str, list[MigDevice]] = {}
        for device in inventory:
            if isinstance(device, MigDevice):
                by_profile.setdefault(device.profile, []).append(device)
        for profile, migs in sorted(by_profile.items()):
            key = "mig-" + label_value(profile)
            labels.update(_mig_shape(migs[0], key))
            labels[f"{key}.count"] = str(sum(1 for m in migs if m.name not in unhealthy))
    return {PREFIX + key: check_value(PREFIX + key, value) for key, value in labels.items()}


# -- the admin scheme -------------------------------------------------------------------------------

#: The placeholders an admin template may use, each from the GFD labels.
PLACEHOLDERS = {
    "product": "nvidia.com/gpu.product",
    "memoryMiB": "nvidia.com/gpu.memory",
    "count": "nvidia.com/gpu.count",
    "family": "nvidia.com/gpu.family",
    "computeMajor": "nvidia.com/gpu.compute.major",
    "computeMinor": "nvidia.com/gpu.compute.minor",
    "migStrategy": "nvidia.com/mig.strategy",
}
#: Placeholders computed from the inventory rather than read from a GFD label.
DERIVED = ("model", "memoryGiB")


@dataclass(frozen=True)
class AdminTemplate:
    """Admin labels: label key -> value template with {placeholder}s; parsed and checked at start-up."""

    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> frozenset[str]:
        """The label keys the scheme writes."""
        return frozenset(self.labels)


def parse_template(text: str) -> AdminTemplate:
    """`key=template[,key=template...]` (e.g. `gpu-type={model},gpu-memory={memoryGiB}gb`); LabelError if bad.

    Keys must be valid label keys outside nvidia.com/ (GFD's own labels), and
    each template may use only known placeholders.
    """
    known = sorted([*PLACEHOLDERS, *DERIVED])
    labels: dict[str, str] = {}
    for raw in (item.strip() for item in text.split(",")):
        if not raw:
            continue
        key, sep, template = raw.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LabelError(
                f"admin label {raw!r}: write it as <label key>=<template>, e.g. gpu-type={{model}}"
            )
        check_key(key)
        if key.startswith(PREFIX):
            raise LabelError(f"admin label {key!r}: keys under {PREFIX} are GFD's; choose another prefix")
        if key in labels:
            raise LabelError(f"admin label {key!r} is given twice")
        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
        except ValueError as err:
            raise LabelError(f"admin label {key}: template {template!r}: {err}") from None
        for name in fields:
            if name not in known:
                raise LabelError(
                    f"admin label {key}: unknown placeholder {{{name}}} in {template!r}; known: "
                    + ", ".join(f"{{{k}}}" for k in known)
                )
        labels[key] = template
    return AdminTemplate(labels)


def admin_labels(template: AdminTemplate, gfd: Mapping[str, str], inventory: Inventory) -> dict[str, str]:
    """The admin scheme rendered from the GFD labels; a label whose value would be empty is left out.

    LabelError when a rendered value is not a valid label value (a template
    that is too long, or a literal with characters labels cannot hold).
    """
    if not gfd:
        return {}
    model = main_model(inventory.gpus)
    memory_mib = int(gfd.get(PLACEHOLDERS["memoryMiB"], "0"))
    values = {name: gfd.get(key, "") for name, key in PLACEHOLDERS.items()}
    values["model"] = short_model(model.product_name) if model else ""
    # Marketing sizes: 81559 MiB is sold as 80 GB; round to the nearest GiB.
    values["memoryGiB"] = str(round(memory_mib / 1024)) if memory_mib else ""
    rendered: dict[str, str] = {}
    for key, text in template.labels.items():
        value = text.format(**values)
        if value:
            rendered[key] = check_value(key, value)
    return rendered
