"""A throwaway certificate authority and a server certificate signed by it, made with the system's
`openssl`: to try TLS on one machine, in tests and benchmarks. Real clusters use certificates from
their own PKI (docs/security.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path, host: str = "127.0.0.1", days: int = 1) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key) in `folder`, the server's for IP `host`."""
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj",
             "/CN=gpuyard throwaway CA", "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", str(key),
             "-out", str(csr))  # fmt: skip
    ext = folder / "san.ext"
    ext.write_text(f"subjectAltName=IP:{host}\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", str(days), "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    for private in (ca_key, key):
        private.chmod(0o600)
    return ca, cert, key
