"""Media by URL, for a server started with --media-urls: http(s) only, a size and a time limit, and no
address that is not a public one (private, loopback, link-local, reserved, multicast), at the first hop
or after a redirect.

Each hop resolves its host once, refuses it unless every address it resolves to is allowed, and connects
to that address (the Host header and TLS name stay the host's), so a name that resolves again to a
private address between the check and the connection (DNS rebinding) reaches nothing. Redirects are
followed by hand, each target checked the same way, at most `max_redirects` of them.
"""
from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
import urllib.parse

from graphc.errors import InvalidInput

MAX_BYTES = 25 << 20       # 25 MiB, as the transcription upload's default
TIMEOUT_S = 10.0
REDIRECTS = 3


def public(ip: str) -> bool:
    """A global unicast address (IPv4-mapped IPv6 is judged as its IPv4)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast


class _Pinned(http.client.HTTPConnection):
    """HTTP to `ip`, while the request names the host."""

    def __init__(self, host: str, ip: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.ip = ip

    def connect(self):
        self.sock = socket.create_connection((self.ip, self.port), self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    """HTTPS to `ip`; the certificate is checked against the host's name."""

    def __init__(self, host: str, ip: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.ip = ip

    def connect(self):
        sock = socket.create_connection((self.ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class Fetcher:
    """fetch(url, kind) -> the body's bytes, or InvalidInput saying why not. allowed(ip): which addresses
    may be reached (default: public ones only)."""

    def __init__(self, max_bytes: int = MAX_BYTES, timeout: float = TIMEOUT_S, max_redirects: int = REDIRECTS,
                 allowed=public):
        self.max_bytes, self.timeout, self.max_redirects, self.allowed = max_bytes, timeout, max_redirects, allowed

    def _refuse(self, url: str, why: str, fix: str = "send the bytes as a base64 data URL") -> InvalidInput:
        return InvalidInput(f"the media URL {url[:200]} is not fetched", why, fix, param="messages")

    def _address(self, url: str, host: str, port: int) -> str:
        try:
            found = {a[4][0] for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except (socket.gaierror, UnicodeError) as e:
            raise self._refuse(url, f"its host {host!r} does not resolve ({e})") from None
        bad = sorted(ip for ip in found if not self.allowed(ip))
        if bad or not found:
            raise self._refuse(url, f"its host {host!r} is at {', '.join(bad) or 'no address'}, which this server "
                               "does not reach (private, loopback, link-local or reserved)")
        return sorted(found)[0]

    def __call__(self, url: str, kind: str = "media") -> bytes:
        start = time.monotonic()
        first = url
        for hop in range(self.max_redirects + 1):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise self._refuse(first, f"it leads to {url[:200]!r}, not an http(s) address")
            if parts.username or parts.password:
                raise self._refuse(first, "it carries a user name or password")
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError as e:
                raise self._refuse(first, f"its port is not a number ({e})") from None
            ip = self._address(first, parts.hostname, port)
            left = self.timeout - (time.monotonic() - start)
            if left <= 0:
                raise self._refuse(first, f"it took more than {self.timeout:g} s")
            conn = (_PinnedTLS if parts.scheme == "https" else _Pinned)(parts.hostname, ip, port, left)
            try:
                conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")),
                             headers={"User-Agent": "graphc", "Accept": "*/*", "Accept-Encoding": "identity"})
                resp = conn.getresponse()
                if resp.status in (301, 302, 303, 307, 308):
                    target = resp.getheader("Location")
                    if not target:
                        raise self._refuse(first, f"it answered {resp.status} without a Location")
                    url = urllib.parse.urljoin(url, target)
                    continue
                if resp.status != 200:
                    raise self._refuse(first, f"it answered HTTP {resp.status} {resp.reason}")
                size = resp.getheader("Content-Length", "")
                if size.isdigit() and int(size) > self.max_bytes:
                    raise self._refuse(first, f"it is {int(size):,} bytes, over the {self.max_bytes:,} this server "
                                       "fetches", "send a smaller file")
                body = bytearray()
                while chunk := resp.read1(1 << 16):
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise self._refuse(first, f"it is over the {self.max_bytes:,} bytes this server fetches",
                                           "send a smaller file")
                    if time.monotonic() - start > self.timeout:
                        raise self._refuse(first, f"it took more than {self.timeout:g} s")
                return bytes(body)
            except (OSError, http.client.HTTPException) as e:
                why = f"it took more than {self.timeout:g} s" if isinstance(e, TimeoutError) else \
                    f"fetching it failed ({type(e).__name__}: {e})"
                raise self._refuse(first, why) from None
            finally:
                conn.close()
        raise self._refuse(first, f"it redirects more than {self.max_redirects} times")
