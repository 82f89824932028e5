"""dra-gpu explain: selectors per device, verdicts per request, offline on fake GPUs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra import cli
from dra.core.slices import build_slices
from dra.explain import devices, shapes
from dra.explain import report as explain
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover

DRIVER = "gpu.nvidia.com"
ATTR = f'device.attributes["{DRIVER}"]'
CAP = f'device.capacity["{DRIVER}"]'


def _slices(profile: str = "h100x8-mig", generation: int = 1) -> list[dict[str, Any]]:
    inventory = discover(FakeGpuLibrary(load_profile(profile), "node-a"))
    return build_slices(inventory, DRIVER, "node-a", None, generation)


def _claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
        "spec": {"devices": devices},
    }


def _exactly(
    name: str, selector: str | None = None, device_class: str = DRIVER, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if selector:
        spec["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": spec}


CLASSES = explain.standard_device_classes(DRIVER)


def test_standard_classes_follow_the_driver_name() -> None:
    assert [c["metadata"]["name"] for c in explain.standard_device_classes("gpu.example.com")] == [
        "gpu.example.com",
        "mig.example.com",
        "vfio.gpu.example.com",
    ]
    assert '"mig"' in explain.standard_device_classes(DRIVER)[1]["spec"]["selectors"][0]["cel"]["expression"]


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = _slices("mixed", generation=1)
    new = _slices("h100x8", generation=2)
    names = [d["name"] for _, _, d in devices.slice_devices(old + new)]
    assert names == [f"gpu-{i}" for i in range(8)]


def test_devices_are_listed_in_natural_order() -> None:
    names = [d["name"] for _, _, d in devices.slice_devices(_slices("h100x8") * 1)]
    assert names[:3] == ["gpu-0", "gpu-1", "gpu-2"]


def test_a_false_selector_names_the_value() -> None:
    report = explain.explain_claim(
        _claim(_exactly("gpu", f'{CAP}.memory.compareTo(quantity("80Gi")) >= 0')), CLASSES, _slices("h100x8")
    )
    [request] = report.requests
    assert request.matching == []
    assert request.verdict() == "0 device(s) match, 1 needed: cannot be allocated"
    assert "memory is 81559Mi" in explain.render(report)


def test_the_class_excludes_before_the_request_selector_runs() -> None:
    # Full GPUs lack `profile`: the class must exclude them before the request's selector errors.
    report = explain.explain_claim(
        _claim(_exactly("mig", f'{ATTR}.profile == "1g.10gb"', device_class="mig.nvidia.com")),
        CLASSES,
        _slices(),
    )
    [request] = report.requests
    assert request.errors == []
    assert len(request.matching) == 8


def test_a_runtime_error_is_the_verdict() -> None:
    report = explain.explain_claim(
        _claim(_exactly("gpu", f'{ATTR}.profile == "1g.10gb"')), CLASSES, _slices()
    )
    [request] = report.requests
    assert request.errors
    assert request.verdict().startswith("the scheduler stops with a CEL runtime error")
    assert "no such key: profile" in request.verdict()


def test_devices_held_by_other_claims_are_not_available() -> None:
    other = {
        "metadata": {"name": "other", "namespace": "ns", "uid": "uid-o"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": DRIVER, "pool": "node-a", "device": f"gpu-{i}", "request": "r"}
                        for i in range(4)
                    ]
                }
            }
        },
    }
    report = explain.explain_claim(_claim(_exactly("gpu", count=1)), CLASSES, _slices(), [other])
    [request] = report.requests
    assert request.matching == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert request.available == []
    assert request.verdict() == "0 matching device(s) free, 1 needed: waits for a free device"
    assert "(in use by ns/other)" in explain.render(report)
    admin = explain.explain_claim(_claim(_exactly("gpu", adminAccess=True)), CLASSES, _slices(), [other])
    assert admin.requests[0].available == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_the_claim_itself_does_not_hold_its_devices() -> None:
    own = _claim(_exactly("gpu"))
    own["status"] = {
        "allocation": {"devices": {"results": [{"driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]}}
    }
    report = explain.explain_claim(own, CLASSES, _slices(), [own])
    assert "gpu-0" in report.requests[0].available


def test_match_attribute_needs_enough_devices_sharing_the_value() -> None:
    pair = _claim(
        _exactly("gpus", count=2),
        constraints=[{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    assert explain.explain_claim(pair, CLASSES, _slices("h100x8")).requests[0].verdict().startswith("can be")
    triple = _claim(
        _exactly("gpus", count=3),
        constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    verdict = explain.explain_claim(triple, CLASSES, _slices("h100x8")).requests[0].verdict()
    assert verdict.startswith("cannot be allocated: at most 2 free matching device(s) share ")
    assert verdict.endswith("resource.kubernetes.io/pcieRoot; 3 needed")


def test_first_available_reports_each_subrequest() -> None:
    claim = _claim(
        {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "h200",
                    "deviceClassName": DRIVER,
                    "selectors": [{"cel": {"expression": f'{ATTR}.productName == "NVIDIA H200"'}}],
                },
                {"name": "any", "deviceClassName": DRIVER},
            ],
        }
    )
    report = explain.explain_claim(claim, CLASSES, _slices("h100x8"))
    assert [r.name for r in report.requests] == ["gpu/h200", "gpu/any"]
    assert report.requests[0].matching == []
    assert len(report.requests[1].matching) == 8
    assert report.notes


def test_all_mode_needs_every_match_free() -> None:
    report = explain.explain_claim(_claim(_exactly("gpus", allocationMode="All")), CLASSES, _slices("h100x8"))
    assert report.requests[0].verdict() == "can be allocated: 8 free matching device(s), 8 needed"


def test_a_missing_class_is_reported() -> None:
    report = explain.explain_claim(_claim(_exactly("gpu", device_class="nope")), CLASSES, _slices())
    assert report.requests[0].verdict() == "cannot be allocated: DeviceClass 'nope' does not exist"


def test_a_selector_that_does_not_compile_is_an_error() -> None:
    with pytest.raises(shapes.ExplainError, match="request selector 1 of request 'gpu' does not compile"):
        explain.explain_claim(_claim(_exactly("gpu", f"{ATTR}.uuid ==")), CLASSES, _slices())


def test_deprecated_attributes_in_selectors_and_constraints_are_pointed_out() -> None:
    custom_class = {
        "metadata": {"name": "first-gpus"},
        "spec": {"selectors": [{"cel": {"expression": f"has({ATTR}.minor) && {ATTR}.minor < 2"}}]},
    }
    claim = _claim(
        _exactly(
            "gpu", f'{ATTR}["pcieBusID"] != "" && {ATTR}.index >= 0', device_class="first-gpus", count=2
        ),
        constraints=[{"matchAttribute": f"{DRIVER}/parentIndex"}],
    )
    [request] = explain.explain_claim(claim, [*CLASSES, custom_class], _slices()).requests
    # Still true today: the verdict is unchanged, only the advice is added.
    assert request.matching == ["gpu-0", "gpu-1"]
    assert request.notes == (
        "class first-gpus selector 1 reads 'minor', deprecated: published until 0.3.0 only and not by "
        "NVIDIA's driver; select on uuid, or resource.kubernetes.io/pciBusID",
        "request selector 1 reads 'index', deprecated: published until 0.3.0 only and not by "
        "NVIDIA's driver; select on uuid, or resource.kubernetes.io/pciBusID",
        "request selector 1 reads 'pcieBusID', deprecated: published until 0.3.0 only and not by "
        "NVIDIA's driver; select on resource.kubernetes.io/pciBusID "
        "(lower case, 4-digit domain: 0000:3b:00.0)",
        "constraint matchAttribute reads 'parentIndex', deprecated: published until 0.3.0 only and not by "
        "NVIDIA's driver; select on parentUUID",
    )


def test_portable_and_other_drivers_attributes_get_no_note() -> None:
    selector = (
        'device.attributes["resource.kubernetes.io"].pciBusID != "" && '
        'has(device.attributes["other.example.com"].index) && '
        f"{ATTR}.uuid != {ATTR}.parentUUID"
    )
    report = explain.explain_claim(_claim(_exactly("mig", selector, "mig.nvidia.com")), CLASSES, _slices())
    assert report.requests[0].notes == ()


def test_claim_templates_are_explained_like_claims() -> None:
    claim = _claim(_exactly("gpu", f'{ATTR}.productName == "NVIDIA H100 80GB HBM3"'))
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": claim["spec"]}}
    assert explain.explain_claim(template, CLASSES, _slices()).requests[0].matching == [
        "gpu-0",
        "gpu-1",
        "gpu-2",
        "gpu-3",
    ]


# -- the command ------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_offline_on_a_claim_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(_claim(_exactly("gpu", f'{CAP}.memory.compareTo(quantity("80Gi")) >= 0'))))
    code, out, err = _run(
        capsys, "explain", "--claim", str(path), "--fake-gpus", "h100x8", "--output", "json"
    )
    assert (code, err) == (0, "")
    [report] = json.loads(out)
    assert report["requests"][0]["verdict"] == "0 device(s) match, 1 needed: cannot be allocated"


def test_explain_a_device_class_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "class.yaml"
    big = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "big"},
        "spec": {"selectors": [{"cel": {"expression": f'{CAP}.memory.compareTo(quantity("40Gi")) >= 0'}}]},
    }
    path.write_text(yaml.safe_dump(big))
    code, out, _ = _run(capsys, "explain", "--device-class", str(path), "--fake-gpus", "mixed")
    assert code == 0
    assert "gpu-0                      match" in out
    assert "gpu-2                      no" in out


def test_the_report_shows_deprecation_notes_under_the_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(_claim(_exactly("gpu", f"{ATTR}.index == 1"))))
    code, out, _ = _run(capsys, "explain", "--claim", str(path), "--fake-gpus", "mixed")
    assert code == 0
    verdict, note = out.splitlines()[-2:]
    assert verdict == "    => can be allocated: 1 free matching device(s), 1 needed"
    assert note.startswith("    note: request selector 1 reads 'index', deprecated: published until 0.3.0")


def test_explain_needs_a_claim_or_a_class(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "explain", "--fake-gpus", "mixed")
    assert code == 1
    assert (
        err.strip()
        == "dra-gpu: error: give --claim (a file or NAMESPACE/NAME) and/or --device-class (a file or a name)"
    )


def test_explain_offline_refuses_cluster_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "explain", "--claim", "ns/name", "--fake-gpus", "mixed")
    assert code == 1
    assert "a cluster claim is NAMESPACE/NAME (without --fake-gpus)" in err


def test_a_count_that_is_not_a_number_is_an_error() -> None:
    with pytest.raises(shapes.ExplainError) as raised:
        explain.explain_claim(_claim(_exactly("gpu", count="two")), CLASSES, _slices())
    assert str(raised.value) == (
        "spec.devices.requests[0].exactly.count: expected an integer from 1 to 9223372036854775807, got 'two'"
    )


def test_explain_without_cluster_credentials_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = _run(
        capsys, "explain", "--claim", "ns/name", "--node-name", "n", "--kubeconfig", "/nonexistent"
    )
    assert code == 1
    assert err.startswith("dra-gpu: error: cannot load Kubernetes credentials from kubeconfig /nonexistent")
    assert err.strip().endswith("(or explain offline with --fake-gpus)")
    assert len(err.strip().splitlines()) == 1


def test_one_budget_per_run_stops_explain_and_names_what_each_selector_spent() -> None:
    # 3 selectors of ~60,000 units each on 8 devices is 1.4 million units: past the run's budget.
    hundred = "[" + ", ".join(str(i) for i in range(100)) + "]"
    heavy = [f"{hundred}.all(x, {hundred}.all(y, y + {i} >= 0))" for i in range(3)]
    request = _exactly("gpu")
    request["exactly"]["selectors"] = [{"cel": {"expression": e}} for e in heavy]
    with pytest.raises(shapes.ExplainError) as raised:
        explain.explain_claim(_claim(request), CLASSES, _slices("h100x8"))
    message = str(raised.value)
    assert message.startswith("explain's CEL budget of 125,000 cost units per run is spent, by request ")
    assert "spent so far: class gpu.nvidia.com selector 1 of request 'gpu' " in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (
            {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": None}]}}
                ]
            },
            "spec.devices.requests[0].exactly.selectors[0].cel: required",
        ),
        (
            {"requests": [_exactly(f"r{i}") for i in range(33)]},
            "spec.devices.requests: must have at most 32 items, has 33",
        ),
        ({"requests": [{"name": ["gpu"]}]}, "spec.devices.requests[0].name: expected a string, got a list"),
    ],
)
def test_a_claim_explain_cannot_read_is_one_line_with_the_field_path(
    devices: dict[str, Any], message: str
) -> None:
    claim = {"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": {"devices": devices}}
    with pytest.raises(shapes.ExplainError) as raised:
        explain.explain_claim(claim, CLASSES, _slices("h100x8"))
    assert str(raised.value) == message


def test_a_constraint_with_a_null_match_attribute_is_refused_as_the_api_server_refuses_it() -> None:
    devices = {"requests": [_exactly("gpu")], "constraints": [{"matchAttribute": None}]}
    claim = {"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": {"devices": devices}}
    with pytest.raises(shapes.ExplainError) as raised:
        explain.explain_claim(claim, CLASSES, _slices("h100x8"))
    assert str(raised.value) == (
        "spec.devices.constraints[0]: exactly one of matchAttribute and distinctAttribute is required; "
        "neither is given"
    )


def test_a_null_count_is_the_default_one() -> None:
    request = _exactly("gpu", count=None)
    (report,) = explain.explain_claim(_claim(request), CLASSES, _slices("h100x8")).requests
    assert report.count == 1
