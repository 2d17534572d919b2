"""The lab CA (streamlab/lab/tls.py): made once, kept, and what it makes verifies."""

from __future__ import annotations

import ssl
from pathlib import Path

from cryptography import x509

from streamlab.lab import tls


def test_ca_signs_a_server_certificate_a_client_verifies_by_name_and_ip(tmp_path: Path) -> None:
    made = tls.ensure(tmp_path / "tls")
    context = made.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    cert = x509.load_pem_x509_certificate(made.server_cert.read_bytes())
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}


def test_keys_are_private_and_a_second_up_keeps_the_ca(tmp_path: Path) -> None:
    first = tls.ensure(tmp_path)
    assert first.ca_key.stat().st_mode & 0o777 == 0o600
    assert first.server_key.stat().st_mode & 0o777 == 0o600
    ca, pin = first.ca_cert.read_bytes(), first.server_spki_sha256()
    again = tls.ensure(tmp_path)
    assert again.ca_cert.read_bytes() == ca  # a browser told to trust it still does
    assert again.server_spki_sha256() == pin


def test_new_names_get_a_new_server_certificate_from_the_same_ca(tmp_path: Path) -> None:
    ca = tls.ensure(tmp_path).ca_cert.read_bytes()
    pin = tls.LabTls(tmp_path).server_spki_sha256()
    made = tls.ensure(tmp_path, (*tls.LOCAL_NAMES, "nginx"))
    assert made.ca_cert.read_bytes() == ca
    assert made.server_spki_sha256() != pin


def test_nginx_snippet_listens_with_tls_and_http2(tmp_path: Path) -> None:
    made = tls.ensure(tmp_path)
    text = tls.write_nginx_snippet(made, "127.0.0.1:8478", cert_dir="/etc/streamlab/tls"
                                   ).read_text()
    assert "listen 127.0.0.1:8478 ssl http2;" in text
    assert "ssl_certificate /etc/streamlab/tls/server.pem;" in text
    assert "ssl_certificate_key /etc/streamlab/tls/server.key;" in text
