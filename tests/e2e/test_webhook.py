"""The admission webhook called by the real API server: bad configs refused with their path, others admitted.

`dra-gpu webhook` runs as a process on 127.0.0.1 with a certificate of a throwaway CA; the
chart's ValidatingWebhookConfiguration (its rules and its matchCondition) is registered with
`clientConfig.url` pointing there instead of at the Service. A driver name of its own keeps
the webhook away from the other tests' objects.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError
from localcluster import chart
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, Obj, wait_for
from localcluster.webhookprocess import WebhookProcess

from tests.skips import Lack, reason

pytestmark = pytest.mark.cluster

DRIVER = "gpu.webhook-test.dra-gpu.test"
RESOURCE_API = "resource.k8s.io/v1"
CONFIG_API = "resource.nvidia.com/v1beta1"


def _parameters(interval: str = "Default") -> Obj:
    return {
        "apiVersion": CONFIG_API,
        "kind": "GpuConfig",
        "sharing": {"timeSlicingConfig": {"interval": interval}},
    }


def _configs(parameters: Obj, driver: str = DRIVER) -> list[Obj]:
    return [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}]


def _devices(configs: list[Obj]) -> Obj:
    return {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}],
        "config": configs,
    }


def _claim(name: str, configs: list[Obj]) -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": _devices(configs)},
    }


def _template(name: str, configs: list[Obj]) -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": _devices(configs)}},
    }


def _device_class(name: str, configs: list[Obj]) -> Obj:
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [selector], "config": configs},
    }


def _reviews(webhook: WebhookProcess) -> float:
    """AdmissionReviews the webhook answered so far."""
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^dra_gpu_webhook_reviews_total\{[^}]*\} (\S+)$", webhook.metrics(), re.M)
    )


def _denial(call: Any) -> str:
    with pytest.raises(DynamicApiError) as caught:
        call()
    message = str(caught.value.summary())
    assert "denied the request" in message, message
    return message


@pytest.fixture(scope="module")
def webhook(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    work: Path = tmp_path_factory.mktemp("webhook")
    process = WebhookProcess(work, DRIVER).start()
    objects = chart.template({"driverName": DRIVER, "webhook": {"enabled": True}}, release="webhook-test")
    [config] = [copy.deepcopy(o) for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"]["name"] = f"dra-gpu-webhook-test-{uuid.uuid4().hex[:6]}"
    for entry in config["webhooks"]:
        entry["clientConfig"] = {"url": process.url, "caBundle": process.ca_bundle}
    try:
        kube.create(config)
        probe = _claim("probe", _configs(_parameters("Never")))

        def refused() -> bool:
            try:
                kube.create(probe, namespace="default", dry_run=True)
            except DynamicApiError:
                return True
            return False

        # The API server starts calling a new webhook configuration within a moment.
        wait_for("the API server to call the webhook", refused, timeout=30)
        yield process
    finally:
        kube.delete(
            "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", config["metadata"]["name"]
        )
        process.stop()


def test_a_claim_with_an_unknown_interval_is_refused_with_the_path(
    webhook: WebhookProcess, kube: Kube, namespace: str
) -> None:
    message = _denial(
        lambda: kube.create(_claim("bad", _configs(_parameters("VeryLong"))), namespace=namespace)
    )
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: "
        '"VeryLong" is not one of '
        '["Default", "Short", "Medium", "Long"]'
    ) in message
    assert kube.get_or_none(RESOURCE_API, "ResourceClaim", "bad", namespace=namespace) is None


def test_a_bad_template_is_refused_with_the_path(webhook: WebhookProcess, kube: Kube, namespace: str) -> None:
    parameters = {
        "apiVersion": CONFIG_API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}},
    }
    message = _denial(lambda: kube.create(_template("bad", _configs(parameters)), namespace=namespace))
    assert (
        "spec.spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
        "0 is outside 1-100" in message
    )


def test_a_bad_device_class_is_refused_with_the_path(webhook: WebhookProcess, kube: Kube) -> None:
    parameters = {
        "apiVersion": CONFIG_API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "replicas": 2},
    }
    name = f"bad-{uuid.uuid4().hex[:6]}.example.com"
    message = _denial(lambda: kube.create(_device_class(name, _configs(parameters))))
    assert (
        "spec.config[0].opaque.parameters.sharing.replicas: unknown field; "
        "known: strategy, timeSlicingConfig, mpsConfig" in message
    )
    assert kube.get_or_none(RESOURCE_API, "DeviceClass", name) is None


def test_a_config_field_given_twice_is_refused_as_nvidias_strict_decoder_refuses_it(
    webhook: WebhookProcess, kube: Kube, namespace: str
) -> None:
    # The body as a JSON client may send it; kubectl would keep one "kind" itself. The API server
    # keeps opaque parameters as sent, even with fieldValidation=Strict, so the webhook sees both.
    body = json.dumps(_claim("twice", _configs(_parameters("Default"))))
    body = body.replace('"kind": "GpuConfig"', '"kind": "GpuConfig", "kind": "MigDeviceConfig"', 1)
    config = kube.api_client.configuration
    response = kube.api_client.rest_client.pool_manager.request(
        "POST",
        f"{config.host}/apis/{RESOURCE_API}/namespaces/{namespace}/resourceclaims?fieldValidation=Strict",
        body=body.encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    message = json.loads(response.data)["message"]
    assert response.status == 422, message
    assert "denied the request" in message
    assert "spec.devices.config[0].opaque.parameters.kind: given more than once; give each once" in message
    assert kube.get_or_none(RESOURCE_API, "ResourceClaim", "twice", namespace=namespace) is None


def test_a_pinned_limit_no_device_can_have_is_refused(
    webhook: WebhookProcess, kube: Kube, namespace: str
) -> None:
    parameters = {
        "apiVersion": CONFIG_API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 1e308}},
    }
    message = _denial(lambda: kube.create(_claim("huge", _configs(parameters)), namespace=namespace))
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
        "1e+308 is outside 1Mi to 9223372036854775807" in message
    )


def test_good_configs_are_admitted(webhook: WebhookProcess, kube: Kube, namespace: str) -> None:
    before = _reviews(webhook)
    created = kube.create(_claim("good", _configs(_parameters("Default"))), namespace=namespace)
    assert created["spec"]["devices"]["config"][0]["opaque"]["parameters"] == _parameters("Default")
    kube.create(
        _template("good", _configs({"apiVersion": CONFIG_API, "kind": "MigDeviceConfig"})),
        namespace=namespace,
    )
    name = f"good-{uuid.uuid4().hex[:6]}.example.com"
    try:
        kube.create(_device_class(name, _configs(_parameters())))
    finally:
        kube.delete(RESOURCE_API, "DeviceClass", name)
    assert _reviews(webhook) == before + 3


def test_config_for_another_driver_is_admitted_untouched_without_a_call(
    webhook: WebhookProcess, kube: Kube, namespace: str
) -> None:
    before = _reviews(webhook)
    foreign = {"apiVersion": "example.com/v1", "kind": "Whatever", "replicas": "many"}
    created = kube.create(
        _claim("foreign", _configs(foreign, driver="other.example.com")), namespace=namespace
    )
    assert created["spec"]["devices"]["config"][0]["opaque"] == {
        "driver": "other.example.com",
        "parameters": foreign,
    }
    kube.create(_claim("plain", []), namespace=namespace)
    # The chart's matchCondition keeps objects without this driver's config away from the webhook.
    assert _reviews(webhook) == before


def test_a_claim_through_a_beta_version_reaches_the_webhook_as_v1(
    webhook: WebhookProcess, kube: Kube, namespace: str
) -> None:
    claim = {**_claim("beta", _configs(_parameters("VeryLong"))), "apiVersion": "resource.k8s.io/v1beta2"}
    try:
        message = _denial(lambda: kube.create(claim, namespace=namespace))
    except ResourceNotFoundError:
        pytest.skip(reason(Lack.RELEASE, "this API server does not serve resource.k8s.io/v1beta2"))
    assert "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval" in message


def test_the_charts_webhook_objects_are_valid_for_the_api_server(kube: Kube, namespace: str) -> None:
    objects = chart.template({"webhook": {"enabled": True}}, release="webhook-objects", namespace=namespace)
    wanted = ("Secret", "Deployment", "Service", "ValidatingWebhookConfiguration")
    created = [kube.create(o, namespace=namespace, dry_run=True) for o in objects if o["kind"] in wanted]
    assert sorted(o["kind"] for o in created) == sorted(wanted)
