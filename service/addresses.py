"""Whether a host is private: a loopback, private, link-local or otherwise non-global address, written in any
form git's resolver reads as an address, a name that means this machine, or a name that resolves to such an
address. The repository policy (:class:`service.targets.RepoPolicy`) refuses private hosts with these, when a
target is added and again in the worker just before git connects (:mod:`workers.checkout`, which then pins git to
the addresses it checked).
"""

from __future__ import annotations

import ipaddress
import re
import socket

_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address when it is one, in any form git's resolver would read as one (``127.1``,
    ``2130706433``, ``0x7f.1``, ``[::1]``); None for a name."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fA-FxX.]+", host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def is_private_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, private, link-local, unspecified, reserved or multicast (also as IPv4 mapped in IPv6)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


def is_private_host(host: str) -> bool:
    """A literal private address or a name that means this machine (``localhost``, ``*.localhost``)."""
    name = host.strip("[]").rstrip(".").lower()
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    address = ip_of(name)
    return address is not None and is_private_address(address)


def resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` resolves to for TCP ``port`` (in the resolver's order, each once); empty when it does
    not resolve."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in found:
            found.append(address)
    return found
