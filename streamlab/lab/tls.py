"""The lab's local certificate authority, for nginx's TLS + HTTP/2 listener.

Browsers speak HTTP/2 only over TLS (no cleartext h2c), so the HTTP/2 edge
needs a certificate. The lab makes its own CA on the first `streamlab up` and
keeps it, with the server's key, in the run directory (never in the
repository), so a browser or curl told to trust it once keeps trusting it
across restarts; `make clean` removes it with the rest of `.run/`.

    <run_dir>/tls/
      ca.pem           the lab CA's certificate: what a client trusts
      ca.key           its key (0600): signs server.pem, nothing else
      server.pem       nginx's certificate: 127.0.0.1, ::1, localhost (+ compose names)
      server.key       its key (0600)
      nginx-h2.conf    nginx's `listen ... ssl http2` and certificate lines (included)

How to trust it: docs/http2.md (curl --cacert, a browser's certificate
settings, chromium's --ignore-certificate-errors-spki-list, which the
seventh-tab scenario uses).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Names every lab's server certificate covers: the host side of both labs.
LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")
CA_DAYS, SERVER_DAYS = 3650, 825  # 825: the longest a browser accepts for a leaf
NGINX_SNIPPET = "nginx-h2.conf"


@dataclass(frozen=True)
class LabTls:
    """Where one lab's CA and server certificate live."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @property
    def nginx_snippet(self) -> Path:
        return self.dir / NGINX_SNIPPET

    def exists(self) -> bool:
        return self.ca_cert.exists() and self.server_cert.exists() and self.server_key.exists()

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the lab CA only (and checks host names)."""
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def server_spki_sha256(self) -> str:
        """base64(sha256(SubjectPublicKeyInfo)) of the server's key: what chromium's
        --ignore-certificate-errors-spki-list takes (and HPKP-style pins are)."""
        return spki_sha256(x509.load_pem_x509_certificate(self.server_cert.read_bytes()))


def spki_sha256(cert: x509.Certificate) -> str:
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def ensure(tls_dir: Path, names: Sequence[str] = LOCAL_NAMES) -> LabTls:
    """The lab's CA and a server certificate for `names`: made if missing, kept
    if present (a new server certificate only when the names changed)."""
    tls = LabTls(tls_dir)
    tls_dir.mkdir(parents=True, exist_ok=True)
    if not (tls.ca_cert.exists() and tls.ca_key.exists()):
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(tls.ca_key, key)
        tls.ca_cert.write_bytes(_ca_certificate(key).public_bytes(serialization.Encoding.PEM))
        tls.server_cert.unlink(missing_ok=True)  # signed by the old CA, if any
    if not tls.server_cert.exists() or not tls.server_key.exists() \
            or _names(tls.server_cert) != set(names):
        ca_key = serialization.load_pem_private_key(tls.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{tls.ca_key}: not the lab CA's EC key")
        ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(tls.server_key, key)
        cert = _server_certificate(key, ca, ca_key, names)
        tls.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return tls


def write_nginx_snippet(tls: LabTls, listen: str, cert_dir: str | None = None) -> Path:
    """The lines that make nginx's server a TLS + HTTP/2 listener too, included by
    nginx.conf.template. `cert_dir`: where nginx finds the files (a container's
    mount point), if not where they were written."""
    where = cert_dir or str(tls.dir)
    tls.nginx_snippet.write_text(
        "# Written by streamlab/lab/tls.py: the TLS + HTTP/2 listener and the lab CA's\n"
        "# server certificate (docs/http2.md). nginx < 1.25 spells http2 in `listen`.\n"
        f"listen {listen} ssl http2;\n"
        f"ssl_certificate {where}/server.pem;\n"
        f"ssl_certificate_key {where}/server.key;\n")
    return tls.nginx_snippet


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamlab local CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "streamlab")])
    now = _now()
    return (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _names(cert_path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName))


def _server_certificate(key: ec.EllipticCurvePrivateKey, ca: x509.Certificate,
                        ca_key: ec.EllipticCurvePrivateKey,
                        names: Sequence[str]) -> x509.Certificate:
    now = _now()
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamlab nginx")]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
