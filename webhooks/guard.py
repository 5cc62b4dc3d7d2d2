"""
Where deliveries may go (docs/webhooks.md, "Where deliveries go"): https URLs whose host resolves
only to public addresses -- never into the control plane's own networks (private, loopback,
link-local, carrier-grade NAT, multicast, reserved). Checked when an endpoint is saved and again
before every attempt (a name may resolve elsewhere later). With MERIDIAN_WEBHOOK_ALLOW_LOOPBACK
(development, tests) http to a loopback host is allowed too.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from core.errors import invalid

CGNAT = ipaddress.ip_network("100.64.0.0/10")


class Refused(Exception):
    """The URL may not be delivered to; the message says why."""


def url_check(url: str) -> list[str]:
    """The addresses ``url``'s host resolves to, each allowed; Refused otherwise."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host:
        raise Refused("The URL has no host.")
    if parts.username or parts.password:
        raise Refused("Leave credentials out of the URL: verify the signature instead.")
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(f"{host} does not resolve ({exc}).") from None
    addresses = [ipaddress.ip_address(a.split("%")[0]) for a in found]
    loopback_ok = settings.MERIDIAN_WEBHOOK_ALLOW_LOOPBACK and all(a.is_loopback for a in addresses)
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback_ok):
        raise Refused("Deliveries go to https URLs only.")
    for address in addresses:
        if loopback_ok:
            continue
        if (address.is_private or address.is_loopback or address.is_link_local or address.is_multicast
                or address.is_reserved or address.is_unspecified or address in CGNAT):
            raise Refused(f"{host} resolves to {address}, inside a private network: deliveries go to public "
                          "addresses only.")
    return sorted(str(a) for a in addresses)


def url_allowed(url: str) -> str:
    """``url`` when deliveries may go there; a 400 naming the reason otherwise."""
    try:
        url_check(url)
    except Refused as exc:
        raise invalid("url", str(exc), code="url_not_allowed") from None
    return url
