"""ZooKeeper URLs: ``zk://host1:2181,host2:2181/chroot`` (:class:`ZooKeeperUrl`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PORT = 2181

_HOST_RE = re.compile(
    r"\s*(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]\s]+))(?::(?P<port>\d+))?\s*")


@dataclass(frozen=True)
class ZooKeeperUrl:
    hosts: tuple[tuple[str, int], ...]
    chroot: str  # "" or "/a/b"

    @classmethod
    def parse(cls, url: str) -> ZooKeeperUrl:
        """Parse ``zk://h1:p1,h2:p2/chroot``; ``ValueError`` says what is wrong."""
        if not url.startswith("zk://"):
            raise ValueError(f"ZooKeeper url {url!r} must start with zk://, "
                             "e.g. zk://127.0.0.1:2181/offloadd")
        rest = url[len("zk://"):]
        slash = rest.find("/")
        host_part, chroot = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
        hosts = tuple(_parse_host(h, url) for h in host_part.split(","))
        chroot = chroot.rstrip("/")
        if chroot and ("//" in chroot or any(c in (".", "..") for c in chroot.split("/")[1:])):
            raise ValueError(f"ZooKeeper url {url!r}: chroot {chroot!r} is not a valid path")
        return cls(hosts, chroot)

    @property
    def connect_string(self) -> str:
        """The hosts, kazoo-style, without the chroot."""
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)

    def absolute(self, path: str) -> str:
        """A store-relative path (already checked) under the chroot."""
        if not self.chroot:
            return path
        return self.chroot if path == "/" else self.chroot + path

    def relative(self, full: str) -> str:
        """The inverse of :meth:`absolute`."""
        if not self.chroot:
            return full
        if full == self.chroot:
            return "/"
        return full[len(self.chroot):] if full.startswith(self.chroot + "/") else full

    def __str__(self) -> str:
        return f"zk://{self.connect_string}{self.chroot}"


def _parse_host(text: str, url: str) -> tuple[str, int]:
    m = _HOST_RE.fullmatch(text)
    if not m:
        raise ValueError(f"ZooKeeper url {url!r}: {text!r} is not host[:port]")
    port = int(m.group("port") or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"ZooKeeper url {url!r}: port {port} is out of range")
    return m.group("v6") or m.group("name"), port
