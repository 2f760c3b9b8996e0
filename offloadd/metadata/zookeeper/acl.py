"""ZooKeeper ACLs and credentials: :class:`DigestAcl`, and kazoo's log kept free of secrets.

With a :class:`DigestAcl` every node the store creates (chroot included) carries
``digest:user:<sha1>`` with all permissions, plus world-read when asked; the client
authenticates with the same credentials on every (re)connect. The password never appears in
``repr``, log records or error text: kazoo logs its Auth request's repr at DEBUG, so each client
logs through a logger of its own carrying :class:`offloadd.logs.RedactFilter` for its secrets
and :class:`offloadd.logs.SessionRedactFilter` for its session's id and password
(:func:`kazoo_logger`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kazoo.security import make_acl, make_digest_acl

from offloadd.logs import RedactFilter, SessionRedactFilter


@dataclass(frozen=True)
class DigestAcl:
    """``digest`` credentials: the ACL on every node we create, and the client's identity."""

    username: str
    password: str = field(repr=False)
    world_readable: bool = False

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username:
            raise ValueError("ZooKeeper digest username must be non-empty and contain no ':'")
        if not self.password:
            raise ValueError(f"ZooKeeper digest password for user {self.username!r} is empty")

    @classmethod
    def parse(cls, text: str, *, world_readable: bool = False) -> DigestAcl:
        """``user:password`` (the password may contain ``:``)."""
        user, sep, password = text.partition(":")
        if not sep:
            raise ValueError("ZooKeeper digest credentials must look like user:password")
        return cls(user, password, world_readable)

    @property
    def credential(self) -> str:
        return f"{self.username}:{self.password}"

    def acls(self) -> list[Any]:
        acls = [make_digest_acl(self.username, self.password, all=True)]
        if self.world_readable:
            acls.append(make_acl("world", "anyone", read=True))
        return acls


_clients = itertools.count(1)


def kazoo_logger(secrets: Iterable[str]) -> logging.Logger:
    """A logger for one kazoo client (a child of the package's), redacting that client's
    secrets in every form (see :func:`offloadd.logs.secret_pattern`) and its session's id and
    password (which kazoo logs at DEBUG on every reconnect). Its level is its parent's,
    ``offloadd.metadata.zookeeper.kazoo``, which :func:`offloadd.logs.configure` keeps at
    WARNING unless asked."""
    logger = logging.getLogger(f"offloadd.metadata.zookeeper.kazoo.{next(_clients)}")
    logger.addFilter(RedactFilter(secrets))
    logger.addFilter(SessionRedactFilter())
    return logger


def release_logger(logger: logging.Logger) -> None:
    for f in list(logger.filters):
        logger.removeFilter(f)
    # Loggers are never freed by the logging module; drop ours from its registry so a process
    # that opens many stores (tests) does not keep one per store.
    logging.Logger.manager.loggerDict.pop(logger.name, None)
