"""Test certificates made on the fly (python `cryptography`): a CA, a server certificate for
127.0.0.1/localhost signed by it, a client certificate signed by it, and an unrelated CA
that clients must not trust. Written as PEM files, the format Sluice reads."""

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
import ipaddress


@dataclass
class Pki:
    ca: Path  # the CA certificate clients and the broker trust
    server: Path  # server key + certificate chain (ssl.keystore.location)
    client_cert: Path
    client_key: Path
    client_bundle: Path  # client key + certificate (Java's PEM keystore)
    other_ca: Path  # a CA nobody trusts


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert_pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _issue(subject: str, key, issuer_name, issuer_key, *, ca: bool, usage=None, sans=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("sluice-test-ca", ca_key, _name("sluice-test-ca"), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue(
        "localhost", server_key, ca.subject, ca_key, ca=False, usage=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue("sluice-test-client", client_key, ca.subject, ca_key, ca=False,
                    usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = _issue("someone-else-ca", other_key, _name("someone-else-ca"), other_key, ca=True)
    pki = Pki(
        ca=directory / "ca.pem",
        server=directory / "server.pem",
        client_cert=directory / "client-cert.pem",
        client_key=directory / "client-key.pem",
        client_bundle=directory / "client.pem",
        other_ca=directory / "other-ca.pem",
    )
    pki.ca.write_bytes(_cert_pem(ca))
    pki.server.write_bytes(_key_pem(server_key) + _cert_pem(server) + _cert_pem(ca))
    pki.client_cert.write_bytes(_cert_pem(client))
    pki.client_key.write_bytes(_key_pem(client_key))
    pki.client_bundle.write_bytes(_key_pem(client_key) + _cert_pem(client))
    pki.other_ca.write_bytes(_cert_pem(other_ca))
    return pki
