"""The chart's webhook option: off by default; Deployment, Service, webhook configuration, TLS both ways."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography import x509
from localcluster import chart
from localcluster.kube import Obj

from tests.unit.test_deploy_chart import _env, _flags, _only

ON: dict[str, Any] = {"webhook": {"enabled": True}}
WEBHOOK_KINDS = {"Deployment", "Service", "ValidatingWebhookConfiguration", "Secret", "Certificate", "Issuer"}


def _webhook(objects: list[Obj]) -> Obj:
    webhooks: list[Obj] = _only(objects, "ValidatingWebhookConfiguration")["webhooks"]
    [webhook] = webhooks
    return webhook


def test_the_webhook_is_off_by_default() -> None:
    assert not {o["kind"] for o in chart.template()} & WEBHOOK_KINDS


def test_chart_with_the_webhook_lints_strictly() -> None:
    assert "0 chart(s) failed" in chart.lint(ON)
    assert "0 chart(s) failed" in chart.lint({"webhook": {"enabled": True, "certManager": {"enabled": True}}})


def test_the_webhook_runs_with_the_generated_secret_and_checks_only_configs_of_this_driver() -> None:
    objects = chart.template({"webhook": {"enabled": True}, "driverName": "gpu.example.com"}, release="r")
    deployment = _only(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["dra-gpu", "webhook"]
    env = _env(container)
    assert set(env) <= _flags("webhook")
    assert env["DRA_GPU_DRIVER_NAME"] == "gpu.example.com"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532  # the Dockerfile's user, which it names
    secret = _only(objects, "Secret")
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": secret["metadata"]["name"]}}]

    webhook = _webhook(objects)
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"][0]["apiVersions"] == ["v1"]
    assert webhook["rules"][0]["resources"] == ["resourceclaims", "resourceclaimtemplates", "deviceclasses"]
    service = _only(objects, "Service")["metadata"]["name"]
    assert webhook["clientConfig"]["service"]["name"] == service
    [condition] = webhook["matchConditions"]
    assert "c.opaque.driver == 'gpu.example.com'" in condition["expression"]

    # The serving certificate names the Service and is signed by the CA in caBundle.
    ca = x509.load_pem_x509_certificate(base64.b64decode(webhook["clientConfig"]["caBundle"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert f"{service}.{secret['metadata']['namespace']}.svc" in names
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)


def test_cert_manager_issues_the_certificate_and_injects_the_ca() -> None:
    objects = chart.template({"webhook": {"enabled": True, "certManager": {"enabled": True}}}, release="r")
    assert "Secret" not in {o["kind"] for o in objects}
    certificate = _only(objects, "Certificate")
    config = _only(objects, "ValidatingWebhookConfiguration")
    namespace = certificate["metadata"]["namespace"]
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{namespace}/{certificate['metadata']['name']}"
    }
    assert "caBundle" not in _webhook(objects)["clientConfig"]
    assert certificate["spec"]["issuerRef"] == {
        "kind": "Issuer",
        "name": _only(objects, "Issuer")["metadata"]["name"],
    }
    own = chart.template(
        {
            "webhook": {
                "enabled": True,
                "certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "ca"}},
            }
        }
    )
    assert "Issuer" not in {o["kind"] for o in own}
    assert _only(own, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "ca"}


def test_failure_policy_and_selectors_are_the_admins() -> None:
    values = {
        "webhook": {
            "enabled": True,
            "failurePolicy": "Ignore",
            "onlyObjectsWithConfig": False,
            "namespaceSelector": {"matchLabels": {"gpu": "yes"}},
            "matchConditions": [
                {"name": "not-system", "expression": "request.userInfo.username != 'system:admin'"}
            ],
        }
    }
    webhook = _webhook(chart.template(values))
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["namespaceSelector"] == {"matchLabels": {"gpu": "yes"}}
    assert [c["name"] for c in webhook["matchConditions"]] == ["not-system"]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"webhook": {"enabled": True, "failurePolicy": "Maybe"}}, "failurePolicy"),
        ({"webhook": {"enable": True}}, "enable"),
    ],
)
def test_values_schema_rejects_webhook_mistakes(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(chart.HelmError, match=complaint):
        chart.template(values)
