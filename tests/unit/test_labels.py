"""Node labels in GFD's form, and the admin scheme's template."""

from __future__ import annotations

import pytest

from dra.core.labels import (
    AdminTemplate,
    LabelError,
    Sharing,
    admin_labels,
    gfd_labels,
    owned,
    parse_template,
)
from dra.model.devices import Inventory
from tests.unit.helpers import inventory, named, profile

EMPTY = Inventory(devices=(), driver_version="550.54.15", cuda_driver_version="12.4.0")


def test_a_node_of_h100s_gets_gfds_labels() -> None:
    labels = gfd_labels(inventory("h100x8"))
    assert labels == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.strategy": "none",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
    }
    assert all(owned(key) for key in labels)


def test_a_node_without_gpus_gets_no_label() -> None:
    assert gfd_labels(EMPTY) == {}


def test_unhealthy_gpus_are_not_counted_but_the_gpu_stays_present() -> None:
    inv = inventory("h100x8")
    labels = gfd_labels(inv, unhealthy={inv.gpus[0].name, inv.gpus[3].name})
    assert labels["nvidia.com/gpu.count"] == "6"
    everything = gfd_labels(inv, unhealthy={g.name for g in inv.gpus})
    assert everything["nvidia.com/gpu.count"] == "0"
    assert everything["nvidia.com/gpu.present"] == "true"


def test_several_models_are_labelled_after_the_most_common_one() -> None:
    inv = inventory(profile({"model": "t4", "count": 1}, {"model": "l40s", "count": 2}))
    labels = gfd_labels(inv)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"
    assert labels["nvidia.com/gpu.count"] == "3"
    # On a tie the model of the lowest index wins.
    assert gfd_labels(inventory("mixed"))["nvidia.com/gpu.product"] == "NVIDIA-L40S"


def test_time_slicing_marks_the_product_shared_unless_the_resource_is_renamed() -> None:
    inv = inventory("h100x8")
    shared = gfd_labels(inv, sharing=Sharing(strategy="time-slicing", replicas={"gpu": 4}))
    assert shared["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert shared["nvidia.com/gpu.replicas"] == "4"
    assert shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    renamed = gfd_labels(
        inv, sharing=Sharing(strategy="time-slicing", replicas={"gpu": 4}, renamed=frozenset({"gpu"}))
    )
    assert renamed["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_mixed_strategy_labels_each_mig_profile() -> None:
    inv = inventory("h100x8-mig")
    labels = gfd_labels(inv, sharing=Sharing(mig_strategy="mixed"))
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/gpu.count"] == "4"  # the GPUs not in MIG mode
    assert labels["nvidia.com/mig-1g.10gb.count"] == "8"
    assert labels["nvidia.com/mig-3g.40gb.count"] == "4"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40192"
    assert labels["nvidia.com/mig-3g.40gb.multiprocessors"] == "60"
    assert labels["nvidia.com/mig-3g.40gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-3g.40gb.engines.decoder"] == "3"
    assert all(owned(key) for key in labels)
    unhealthy = next(d.name for d in inv if getattr(d, "profile", "") == "3g.40gb")
    assert gfd_labels(inv, {unhealthy}, Sharing(mig_strategy="mixed"))["nvidia.com/mig-3g.40gb.count"] == "3"


def test_single_strategy_describes_the_mig_devices_as_the_gpu() -> None:
    inv = inventory(profile({"model": "a100-sxm4-40gb", "count": 2, "mig": ["1g.5gb"] * 7}))
    labels = gfd_labels(inv, sharing=Sharing(mig_strategy="single"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "4864"
    assert labels["nvidia.com/gpu.slices.gi"] == "1"


def test_single_strategy_on_a_layout_it_cannot_serve_labels_full_gpus() -> None:
    labels = gfd_labels(inventory("h100x8-mig"), sharing=Sharing(mig_strategy="single"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert not any(key.startswith("nvidia.com/mig-") for key in labels)


def test_mig_profile_with_a_plus_becomes_a_legal_key() -> None:
    inv = inventory(profile({"model": "a100-sxm4-40gb", "mig": ["1g.5gb+me"]}))
    labels = gfd_labels(inv, sharing=Sharing(mig_strategy="mixed"))
    assert labels["nvidia.com/mig-1g.5gb-me.count"] == "1"


def test_a_long_product_name_is_cut_to_a_legal_value() -> None:
    long_name = "NVIDIA " + "Very Long Name " * 6
    inv = inventory(named(profile({"productName": "x", "memoryMiB": 1024}), long_name))
    value = gfd_labels(inv)["nvidia.com/gpu.product"]
    assert len(value) <= 63
    assert value[-1].isalnum()


def test_unknown_strategies_are_refused() -> None:
    with pytest.raises(LabelError, match="unknown MIG strategy 'some'"):
        Sharing(mig_strategy="some")
    with pytest.raises(LabelError, match="unknown sharing strategy"):
        Sharing(strategy="slicing")


def test_only_the_labellers_own_keys_are_owned() -> None:
    assert owned("nvidia.com/gpu.product")
    assert owned("nvidia.com/mig-7g.80gb.engines.ofa")
    assert owned("gpu-type", admin_keys={"gpu-type"})
    # Labels others set under nvidia.com/ (the GPU operator's) are not the labeller's.
    assert not owned("nvidia.com/device-plugin.config")
    assert not owned("nvidia.com/mig.config")
    assert not owned("gpu-type")


def test_admin_template_renders_short_labels() -> None:
    template = parse_template("gpu-type={model}, gpu-memory={memoryGiB}gb,example.com/gpus={count}")
    inv = inventory("h100x8")
    assert admin_labels(template, gfd_labels(inv), inv) == {
        "gpu-type": "h100",
        "gpu-memory": "80gb",
        "example.com/gpus": "8",
    }
    t4 = inventory(profile({"model": "t4"}))
    assert admin_labels(template, gfd_labels(t4), t4)["gpu-type"] == "t4"
    assert admin_labels(template, {}, EMPTY) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu-type", "write it as <label key>=<template>"),
        ("gpu-type={modle}", r"unknown placeholder \{modle\}"),
        ("nvidia.com/type={model}", "keys under nvidia.com/ are GFD's"),
        ("Bad_Prefix/type={model}", "not a DNS subdomain"),
        ("-type={model}", "the name '-type' must be"),
        ("a={model},a={family}", "given twice"),
        ("a={model", "template '{model'"),
    ],
)
def test_bad_templates_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(LabelError, match=message):
        parse_template(text)


def test_a_template_rendering_an_illegal_value_is_an_error() -> None:
    inv = inventory("h100x8")
    with pytest.raises(LabelError, match="label gpu-type: value 'h100 gpu'"):
        admin_labels(AdminTemplate({"gpu-type": "{model} gpu"}), gfd_labels(inv), inv)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("gpu.nvidia.com", True),
        ("a" * 63, True),
        ("a" * 64, False),  # DriverNameMaxLength
        ("gpu..nvidia.com", False),
        ("-gpu.nvidia.com", False),
        ("GPU.nvidia.com", False),
        ("../../x", False),
    ],
)
def test_driver_names_are_checked_as_the_api_server_checks_them(name: str, ok: bool) -> None:
    import argparse

    from dra.daemon.flags import dns_subdomain

    if ok:
        assert dns_subdomain(name) == name
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="is not a DRA driver name"):
            dns_subdomain(name)


def test_a_dns_subdomain_may_be_longer_than_a_driver_name() -> None:
    from dra.core.labels import is_dns_subdomain

    assert is_dns_subdomain("a" * 200 + ".example.com")
    assert not is_dns_subdomain("a" * 254)
