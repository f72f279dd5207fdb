"""Certificates for the embedded server's TLS, made with the `cryptography` library.

`gpuyard up --listen` on an address beyond loopback makes the cluster's own CA once (in
`<state-dir>/tls/`, kept across restarts) and a server certificate it signs for the names clients
reach the server by (`cluster_tls`); every profile carries the CA, so clients verify the server.
An operator with a PKI of their own gives `up` its certificates instead (docs/security.md).
`make_pki` makes a throwaway pair for tests and benchmarks.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_DAYS = 397
"""A server certificate's life (what browsers accept at most); `up` makes a new one, signed by the
same CA, when it has less than `RENEW_DAYS` left or the names changed."""
RENEW_DAYS = 30

Key = ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_ca(common_name: str, days: int = CA_DAYS) -> tuple[x509.Certificate, Key]:
    """A self-signed CA that signs server certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(public).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert, key


def server_cert(
    ca: x509.Certificate, ca_key: Key, hosts: list[str], days: int = SERVER_DAYS
) -> tuple[x509.Certificate, Key]:
    """A server certificate for `hosts` (IP addresses or DNS names), signed by `ca`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0])).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    return cert, key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write `path` created with `mode` (a key is never readable by others on the way)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _write_key(path: Path, key: Key) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    _write(path, pem, 0o600)


def _load_key(path: Path) -> Key:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: not the EC key gpuyard makes")
    return key


def _still_good(path: Path, ca: x509.Certificate, hosts: list[str]) -> bool:
    """The server certificate at `path` is `ca`'s, for exactly `hosts`, with time left."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return set(names) == {_san(h) for h in hosts} and left > datetime.timedelta(days=RENEW_DAYS)


def cluster_tls(folder: Path, hosts: list[str], cluster: str) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key) in `folder`: the CA made once and kept (its key, ca.key,
    mode 600, never leaves the folder), the server's certificate for `hosts` made again when
    they changed or it nears its end."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    ca_path, ca_key_path = folder / "ca.pem", folder / "ca.key"
    cert_path, key_path = folder / "server.pem", folder / "server.key"
    if ca_path.exists() and ca_key_path.exists():
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        ca_key = _load_key(ca_key_path)
    else:
        ca, ca_key = new_ca(f"gpuyard cluster {cluster} CA")
        _write_key(ca_key_path, ca_key)
        _write(ca_path, _pem(ca), 0o644)
    if not (key_path.exists() and _still_good(cert_path, ca, hosts)):
        cert, key = server_cert(ca, ca_key, hosts)
        _write_key(key_path, key)
        _write(cert_path, _pem(cert), 0o644)
    return ca_path, cert_path, key_path


def make_pki(folder: Path, host: str = "127.0.0.1", days: int = 1) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for `host`, valid `days`: (ca.pem, server.pem,
    server.key) in `folder`, for tests and benchmarks."""
    ca, ca_key = new_ca("gpuyard throwaway CA", days)
    cert, key = server_cert(ca, ca_key, [host], days)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    _write_key(folder / "ca.key", ca_key)
    _write(paths[0], _pem(ca), 0o644)
    _write(paths[1], _pem(cert), 0o644)
    _write_key(paths[2], key)
    return paths


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuyard.pki DIR NAME...`: the files `gpuyard up` makes, for a server of your own
    (deploy/): the CA once in DIR, and a server certificate for NAMEs (addresses, DNS names)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m gpuyard.pki",
        description="Make a cluster's CA (once: kept in DIR) and a server certificate it signs.",
    )
    parser.add_argument("folder", type=Path, metavar="DIR", help="e.g. /etc/gpuyard/tls")
    parser.add_argument("names", nargs="+", metavar="NAME", help="the server's addresses and names")
    parser.add_argument("--cluster", default="default", help="named in the CA's subject")
    args = parser.parse_args(argv)
    try:
        ca, cert, key = cluster_tls(args.folder, args.names, args.cluster)
    except (OSError, ValueError) as exc:
        print(f"gpuyard.pki: {exc}", file=sys.stderr)
        return 1
    print(f"CA {ca} (clients' tls_ca); server certificate {cert}, key {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
