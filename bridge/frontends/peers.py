"""Who is at the other end of a client connection, as the logs name it."""

from __future__ import annotations

_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
          "countryName": "C"}


def tls_subject(peercert: dict[str, object] | None) -> str | None:
    """A client certificate's subject as ``CN=a,O=b``; None without one."""
    if not peercert:
        return None
    parts = [f"{_SHORT.get(name, name)}={value}"
             for rdn in peercert.get("subject", ())  # type: ignore[attr-defined]
             for name, value in rdn]
    return ",".join(parts) or None
