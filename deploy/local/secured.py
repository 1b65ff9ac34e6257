"""Throwaway credentials of the local stack's secured profile (see stack.py --profile secured).

At the first start of a secured state folder this makes, under `<state>/secrets/` (mode 0700,
every file 0600):

- `ca.pem` / `ca.key`: a CA valid for 30 days, made here and trusted by nothing else;
- `server.pem`: key (PKCS#8, unencrypted) and certificate chain of the servers, for
  127.0.0.1 and localhost, which Kafka reads as a PEM key store;
- `cassandra-keystore.p12` and `cassandra-keystore.password`: the same key and certificate as
  a PKCS#12 key store for Cassandra's client_encryption_options;
- `<user>.password` for the Kafka SCRAM (and PLAIN) users and the Cassandra roles (admin,
  node, worker, submitter, ops): random, one line each;
- `client.pem`, `client.key` and `client-key.password`: a client certificate (CN
  chronowheel-admin-client) with an encrypted PKCS#8 key, for Kafka's mutual-TLS listener.

Nothing here is a real secret: it exists to test TLS, SASL and authorization for real on one
machine. Needs the `cryptography` package (the project's dev extra).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

USERS = ("admin", "node", "worker", "submitter", "ops")


@dataclass(frozen=True)
class Material:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def server_pem(self) -> Path:
        return self.folder / "server.pem"

    @property
    def cassandra_keystore(self) -> Path:
        return self.folder / "cassandra-keystore.p12"

    @property
    def cassandra_keystore_password(self) -> Path:
        return self.folder / "cassandra-keystore.password"

    def password_file(self, user: str) -> Path:
        return self.folder / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"

    @property
    def client_key_password(self) -> Path:
        return self.folder / "client-key.password"

    def complete(self) -> bool:
        files = [self.ca, self.server_pem, self.cassandra_keystore,
                 self.cassandra_keystore_password, *(self.password_file(u) for u in USERS)]
        return all(f.exists() for f in files)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


CLIENT_CN = "chronowheel-admin-client"


def ensure(folder: Path) -> Material:
    """Make the material once per state folder; return where it is."""
    material = Material(folder)
    if not material.complete():
        _make_core(material)
    if not material.client_key.exists():
        _make_client(material)
    return material


def _make_core(material: Material) -> None:
    folder = material.folder
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import pkcs12
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # pragma: no cover - the dev extra has it
        raise RuntimeError("the secured profile needs the `cryptography` package: install the "
                           "project's dev extra (pip install -e '.[dev]')") from exc

    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=30)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chronowheel local test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    _write_private(material.ca, ca_cert.public_bytes(pem))
    _write_private(material.ca_key, ca_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    _write_private(material.server_pem, server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + server_cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    store_password = secrets.token_urlsafe(18)
    _write_private(material.cassandra_keystore_password, (store_password + "\n").encode())
    _write_private(material.cassandra_keystore, pkcs12.serialize_key_and_certificates(
        b"cassandra", server_key, server_cert, [ca_cert],
        serialization.BestAvailableEncryption(store_password.encode())))
    for user in USERS:
        _write_private(material.password_file(user), (secrets.token_urlsafe(18) + "\n").encode())


def _make_client(material: Material) -> None:
    """A client certificate signed by the CA, its key encrypted with a random passphrase."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(material.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(material.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CLIENT_CN)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    passphrase = secrets.token_urlsafe(18)
    pem = serialization.Encoding.PEM
    _write_private(material.client_key_password, (passphrase + "\n").encode())
    _write_private(material.client_key, key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase.encode())))
    _write_private(material.client_cert, cert.public_bytes(pem))
