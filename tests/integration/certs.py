"""Self-signed certificates for TLS tests, made with the openssl command line: a CA, and
certificates it signs for the bridge (localhost, 127.0.0.1) and for clients."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    folder: Path
    pem: Path
    key: Path

    def issue(self, name: str, cn: str, *, server: bool = True) -> Pair:
        """A certificate for ``cn`` (with localhost and 127.0.0.1 as names when ``server``)."""
        d = self.folder
        _openssl("req", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}/O=jms-bridge tests", cwd=d)
        ext = d / f"{name}.ext"
        ext.write_text("basicConstraints=CA:FALSE\n" + (
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n" if server
            else "extendedKeyUsage=clientAuth\n"))
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", self.pem.name, "-CAkey",
                 self.key.name, "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                 "-extfile", ext.name, cwd=d)
        return Pair(d / f"{name}.pem", d / f"{name}.key")


def authority(folder: Path, cn: str = "jms-bridge test CA") -> Authority:
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", f"/CN={cn}", cwd=folder)
    return Authority(folder, folder / "ca.pem", folder / "ca.key")
