"""The webhook's verdicts on AdmissionReviews: the field path in the object, other drivers left alone."""

from __future__ import annotations

from typing import Any

import pytest

from dra.webhook.admission import ReviewError, review

DRIVER = "gpu.nvidia.com"
API = "resource.nvidia.com/v1beta1"


def _config(parameters: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}


def _gpu(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


def _object(kind: str, configs: list[dict[str, Any]]) -> dict[str, Any]:
    devices = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
        "config": configs,
    }
    specs: dict[str, dict[str, Any]] = {
        "ResourceClaim": {"devices": devices},
        "ResourceClaimTemplate": {"spec": {"devices": devices}},
        "DeviceClass": {"config": configs},
    }
    spec = specs[kind]
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "x"}, "spec": spec}


def _review(
    obj: dict[str, Any] | None, kind: str = "ResourceClaim", operation: str = "CREATE"
) -> dict[str, Any]:
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
        "operation": operation,
        "object": obj,
    }
    answer, _ = review(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}, DRIVER
    )
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == request["uid"]
    response: dict[str, Any] = answer["response"]
    return response


def _denial(response: dict[str, Any]) -> str:
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    message: str = response["status"]["message"]
    return message


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("ResourceClaim", "spec.devices.config[1]"),
        ("ResourceClaimTemplate", "spec.spec.devices.config[1]"),
        ("DeviceClass", "spec.config[1]"),
    ],
)
def test_a_bad_config_is_denied_with_its_path_in_the_object(kind: str, path: str) -> None:
    configs = [_config(_gpu()), _config(_gpu(timeSlicingConfig={"interval": "VeryLong"}))]
    assert _denial(_review(_object(kind, configs), kind)) == (
        f"invalid {DRIVER} configuration: {path}.opaque.parameters.sharing.timeSlicingConfig.interval: "
        '"VeryLong" is not one of ["Default", "Short", "Medium", "Long"]'
    )


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (_gpu(strategy="Sharing"), 'sharing.strategy: "Sharing" is not one of ["TimeSlicing", "MPS"]'),
        (
            _gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 0}),
            "sharing.mpsConfig.defaultActiveThreadPercentage: 0 is outside 1-100",
        ),
        ({"apiVersion": API, "kind": "GpuConfig", "extra": 1}, "extra: unknown field; known: sharing"),
        (
            {"apiVersion": API, "kind": "Gpu"},
            'kind: "Gpu" is not one of ["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"]',
        ),
        (
            _gpu(
                strategy="MPS",
                mpsConfig={"defaultPerDevicePinnedMemoryLimit": {f"{i}": "1Gi" for i in range(999)}},
            ),
            "parameters: ",
        ),
        ("GpuConfig", "parameters: expected an object with apiVersion and kind"),
    ],
)
def test_every_check_prepare_makes_without_devices_is_made(parameters: Any, expected: str) -> None:
    message = _denial(_review(_object("ResourceClaim", [_config(parameters)])))
    where = (
        "spec.devices.config[0].opaque"
        if expected.startswith("parameters")
        else "spec.devices.config[0].opaque.parameters"
    )
    assert f"{where}.{expected}" in message


def test_every_bad_config_is_named() -> None:
    configs = [_config(_gpu(strategy="X")), _config(_gpu(timeSlicingConfig={"interval": "X"}))]
    message = _denial(_review(_object("ResourceClaim", configs)))
    assert "config[0].opaque.parameters.sharing.strategy" in message
    assert "; spec.devices.config[1].opaque.parameters.sharing.timeSlicingConfig.interval" in message


def test_good_configs_and_other_drivers_configs_are_admitted() -> None:
    configs = [
        _config(_gpu(timeSlicingConfig={"interval": "Default"})),
        _config(_gpu(timeSlicingConfig={"interval": "Medium"})),
        _config(_gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 10})),
        _config({"apiVersion": API, "kind": "MigDeviceConfig"}),
        _config({"anything": "goes"}, driver="other.example.com"),
        {"requests": ["gpu"]},
    ]
    for kind in ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass"):
        assert _review(_object(kind, configs), kind) == {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "allowed": True,
        }
    assert _review(_object("ResourceClaim", []))["allowed"] is True


def test_a_delete_and_other_kinds_are_admitted() -> None:
    assert _review(None, operation="DELETE")["allowed"] is True
    other = _review({"apiVersion": "v1", "kind": "Pod"}, kind="Pod")
    assert other["allowed"] is True
    assert other["warnings"] == ["dra-gpu webhook does not check Pod; admitted"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([], "expected an AdmissionReview of admission.k8s.io/v1"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "1"}}, "expected an AdmissionReview"),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
            "has no request with a string uid",
        ),
    ],
)
def test_what_is_not_a_review_is_an_error(body: object, error: str) -> None:
    with pytest.raises(ReviewError, match=error):
        review(body, DRIVER)
