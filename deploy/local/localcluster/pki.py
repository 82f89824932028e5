"""Certificates for the local test cluster: one CA, serving and client certificates.

EC P-256 keys keep generation in the milliseconds, so every cluster start can
make a fresh PKI instead of sharing secrets between runs.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as written to disk."""

    cert: Path
    key: Path


def write_private_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    """Write a private key as unencrypted PKCS#8 PEM, readable by its owner only."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class CertificateAuthority:
    """A throwaway CA that signs the cluster's certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dra-gpu-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            # Python 3.13's default TLS context verifies strictly (VERIFY_X509_STRICT): a CA without
            # its key identifier, or a leaf without its issuer's, is refused.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
    ) -> KeyPair:
        """Sign a certificate; `hosts` become DNS or IP SANs, `server` adds serverAuth."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pair = KeyPair(cert=self.directory / f"{name}.crt", key=self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_private_key(key, pair.key)
        return pair


def service_account_key(directory: Path) -> tuple[Path, Path]:
    """A key pair the API server signs service-account tokens with: (private, public)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / "sa.key"
    public = directory / "sa.pub"
    write_private_key(key, private)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def cluster_credentials(run: Path, api: str, node_name: str, control_plane: str, node: str) -> dict[str, str]:
    """A fresh CA under run/pki, every component's certificate and kubeconfig; the paths, by use.

    `control_plane` and `node` are the API server's and the kubelet's addresses.
    """
    ca = CertificateAuthority(run / "pki")
    serving = ca.issue(
        "apiserver",
        "kube-apiserver",
        hosts=(
            control_plane,
            "127.0.0.1",
            "localhost",
            "10.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        server=True,
    )
    kubelet_serving = ca.issue("kubelet-serving", node_name, hosts=(node,), server=True)
    apiserver_kubelet = ca.issue(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
    )
    sa_key, sa_pub = service_account_key(run / "pki")
    clients = {
        "admin": ca.issue("admin", "kubernetes-admin", ("system:masters",)),
        "controller-manager": ca.issue("controller-manager", "system:kube-controller-manager"),
        "scheduler": ca.issue("scheduler", "system:kube-scheduler"),
        "kubelet": ca.issue("kubelet", f"system:node:{node_name}", ("system:nodes",)),
        # The user the default ClusterRoleBinding system:node-proxier binds.
        "kube-proxy": ca.issue("kube-proxy", "system:kube-proxy"),
    }
    for name, pair in clients.items():
        write_kubeconfig(run / f"{name}.kubeconfig", api, ca.cert_path, pair)
    ca_key = run / "pki" / "ca.key"
    write_private_key(ca.key, ca_key)
    return {
        "ca": str(ca.cert_path),
        "ca_key": str(ca_key),
        "serving_cert": str(serving.cert),
        "serving_key": str(serving.key),
        "kubelet_serving_cert": str(kubelet_serving.cert),
        "kubelet_serving_key": str(kubelet_serving.key),
        "apiserver_kubelet_cert": str(apiserver_kubelet.cert),
        "apiserver_kubelet_key": str(apiserver_kubelet.key),
        "sa_key": str(sa_key),
        "sa_pub": str(sa_pub),
        "admin_cert": str(clients["admin"].cert),
        "admin_key": str(clients["admin"].key),
    }


def write_kubeconfig(path: Path, server: str, ca: Path, pair: KeyPair) -> None:
    """A kubeconfig that reaches `server` as the certificate's user."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [
            {"name": "user", "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
