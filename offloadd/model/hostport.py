"""``host:port`` as operators write it (a metrics bind, a ZooKeeper host, a bookie id): one parser.

IPv6 hosts come in brackets (``[::1]:9105``) and leave without them. A bind address that listens
on every interface (``0.0.0.0``, ``::``) is not an address to connect to: :func:`connect_url`
turns it into the loopback one, for the commands that talk to the daemon on this host.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostPort", "connect_url"]

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True)
class HostPort:
    host: str  # without brackets
    port: int

    @classmethod
    def parse(cls, text: str, *, allow_zero: bool = False) -> HostPort:
        """``host:port`` or ``[v6addr]:port``; ValueError saying what is wrong. Port 0 (pick a
        free one) only with ``allow_zero``."""
        host, sep, port = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise ValueError(f"{text!r}: an IPv6 host goes in brackets, e.g. [::1]:2181")
        if not sep or not host or not port.isascii() or not port.isdigit():
            raise ValueError(f"{text!r} is not host:port")
        number = int(port)
        if not (0 if allow_zero else 1) <= number <= 65535:
            raise ValueError(f"{text!r}: port {number} is outside "
                             f"{0 if allow_zero else 1}..65535")
        return cls(host, number)

    @property
    def netloc(self) -> str:
        """For a URL: IPv6 hosts back in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def connect_url(bind: str, path: str = "") -> str:
    """The ``http://`` URL that reaches, from this host, a server bound to ``bind``."""
    hp = HostPort.parse(bind, allow_zero=True)
    if hp.host in _WILDCARDS:
        hp = HostPort("127.0.0.1", hp.port)
    return f"http://{hp.netloc}{path}"
