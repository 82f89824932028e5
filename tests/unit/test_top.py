"""`dra-gpu top`'s table: from claims as the driver's status writes leave them."""

from __future__ import annotations

from typing import Any

import pytest

from dra.daemon.metrics import claim_usage
from dra.kubeletplugin.top import HEADER, render, rows

DRIVER = "gpu.nvidia.com"


def _claim(name: str, pool: str, *entries: dict[str, Any], pods: tuple[str, ...] = ("p",)) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": name},
        "status": {
            "reservedFor": [{"resource": "pods", "name": p, "uid": "u"} for p in pods],
            "devices": [{"driver": DRIVER, "pool": pool, **e} for e in entries],
        },
    }


def test_rows_show_this_drivers_devices_on_the_node_with_sharing_and_limits() -> None:
    mig = {"uuid": "MIG-1", "profile": "1g.10gb", "sharing": {"strategy": "Exclusive"}}
    shared = {
        "uuid": "GPU-2",
        "sharing": {"strategy": "TimeSlicing", "interval": "Default", "shareID": "s1", "shareMemory": "20Gi"},
    }
    mps = {
        "uuid": "GPU-3",
        "sharing": {
            "strategy": "MPS",
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10240M",
        },
    }
    claims = [
        _claim("b", "node-a", {"device": "gpu-0-mig-1g10gb-at3", "data": mig}, pods=("x", "y")),
        _claim("a", "node-a", {"device": "gpu-1", "data": shared}),
        _claim("c", "node-a", {"device": "gpu-2", "data": mps}, pods=()),
        _claim("elsewhere", "node-b", {"device": "gpu-0", "data": mig}),
        {
            "metadata": {"namespace": "team", "name": "other"},
            "status": {"devices": [{"driver": "nic.example.com", "pool": "node-a", "device": "nic-0"}]},
        },
    ]
    assert rows(claims, DRIVER, "node-a") == [
        ("team", "p", "a", "gpu-1", "GPU-2", "-", "TimeSlicing (Default) share s1", "20Gi", "-", "-"),
        ("team", "x,y", "b", "gpu-0-mig-1g10gb-at3", "MIG-1", "1g.10gb", "Exclusive", "device", "-", "-"),
        ("team", "-", "c", "gpu-2", "GPU-3", "-", "MPS 50% threads", "10240M", "-", "-"),
    ]
    assert len(rows(claims, DRIVER, "")) == 4, "every node's"


def test_render_aligns_the_columns_under_the_header() -> None:
    text = render([("team", "p", "a", "gpu-1", "GPU-2", "-", "Exclusive", "device", "1.5Gi", "60%")])
    header, row = text.splitlines()
    assert header.split() == [w for h in HEADER for w in h.split()]
    assert header.index("CLAIM") == row.index(" a ") + 1


def test_usage_columns_come_from_the_driver_s_scrape_summed_over_containers() -> None:
    labels = (
        'UUID="GPU-2",GPU_I_ID="",dra_claim_namespace="team",dra_claim_name="a",'
        'dra_device_name="gpu-1",namespace="team",pod="p"'
    )
    scrape = "\n".join(
        [
            "# TYPE dra_gpu_claim_memory_used_bytes gauge",
            f'dra_gpu_claim_memory_used_bytes{{{labels},container="main"}} 1073741824',
            f'dra_gpu_claim_memory_used_bytes{{{labels},container="side"}} 536870912',
            "# TYPE dra_gpu_claim_utilization_ratio gauge",
            f'dra_gpu_claim_utilization_ratio{{{labels},container="main"}} 0.5',
            f'dra_gpu_claim_utilization_ratio{{{labels},container="side"}} 0.1',
            "",
        ]
    )
    usage = claim_usage(scrape)
    [(key, (memory, utilization))] = usage.items()
    assert (key, memory) == (("team", "a", "gpu-1"), 1.5 * 2**30)
    assert utilization == pytest.approx(0.6)
    shared = {"uuid": "GPU-2", "sharing": {"strategy": "Exclusive"}}
    claims = [
        _claim("a", "node-a", {"device": "gpu-1", "data": shared}),
        _claim("b", "node-a", {"device": "gpu-2", "data": shared}),
    ]
    found = rows(claims, DRIVER, "node-a", usage)
    assert [row[-2:] for row in found] == [("1.5Gi", "60%"), ("-", "-")]
