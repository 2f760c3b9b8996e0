"""ZooKeeper URLs: ``zk://host1:2181,host2:2181/chroot`` (:class:`ZooKeeperUrl`)."""

from __future__ import annotations

from dataclasses import dataclass

from offloadd.model.hostport import HostPort

DEFAULT_PORT = 2181


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
    given = text.strip()
    if given.endswith("]") or ":" not in given:  # no port: ZooKeeper's default
        given = f"{given}:{DEFAULT_PORT}"
    try:
        hp = HostPort.parse(given)
    except ValueError as exc:
        raise ValueError(f"ZooKeeper url {url!r}: {exc}") from None
    return hp.host, hp.port
