"""Every kazoo failure of the ZooKeeper store, translated into the error tree (:func:`translate`).

=======================================================  =====================================
``NoNodeError``                                          ``NotFound``
``NodeExistsError``, ``BadVersionError``,                ``Conflict``
``NotEmptyError``
connection loss, session expiry/moved, ZooKeeper or      ``Retriable``
per-call timeout (``op_timeout_s``), no quorum
``NoAuthError``, bad arguments/ACL, closed store, ...    ``Fatal``
=======================================================  =====================================

A failed ``multi`` names the op that failed (:func:`describe`; ZooKeeper reports the others as
rolled back).
"""

from __future__ import annotations

from kazoo.exceptions import (
    AuthFailedError,
    BadArgumentsError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NewConfigNoQuorumError,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RequestTimeoutError,
    SessionExpiredError,
    SessionMovedError,
    ThrottledOpError,
)
from kazoo.handlers.threading import KazooTimeoutError

from offloadd.errors import Conflict, Fatal, NotFound, OffloaddError, Retriable
from offloadd.metadata.base import CreateOp, DeleteOp, Op, SetOp

_RETRIABLE = (ConnectionLoss, SessionExpiredError, SessionMovedError, OperationTimeoutError,
              RequestTimeoutError, NewConfigNoQuorumError, ThrottledOpError, KazooTimeoutError)


def translate(exc: BaseException, what: str, path: str) -> OffloaddError:
    """Map a kazoo (or socket) failure of ``what`` on ``path`` to our error tree."""
    if isinstance(exc, NoNodeError):
        if what == "create":
            return NotFound(f"parent of metadata node {path} does not exist")
        return NotFound(f"metadata node {path} does not exist")
    if isinstance(exc, NodeExistsError):
        return Conflict(f"metadata node {path} already exists")
    if isinstance(exc, BadVersionError):
        return Conflict(f"metadata node {path} is not at the expected version")
    if isinstance(exc, NotEmptyError):
        return Conflict(f"metadata node {path} has children; not deleting")
    if isinstance(exc, ConnectionClosedError):
        return Fatal(f"ZooKeeper {what} {path}: the client is closed")
    if isinstance(exc, _RETRIABLE):
        return Retriable(f"ZooKeeper {what} {path}: {type(exc).__name__} (connection lost or "
                         "session expired); a write may or may not have been applied: re-read")
    if isinstance(exc, NoAuthError):
        return Fatal(f"ZooKeeper {what} {path}: not authorized by the node's ACL; check the "
                     "[metadata] digest credentials")
    if isinstance(exc, AuthFailedError):
        return Fatal(f"ZooKeeper {what} {path}: authentication failed; check the credentials")
    if isinstance(exc, NoChildrenForEphemeralsError):
        return Fatal(f"cannot create {path}: its parent is ephemeral")
    if isinstance(exc, (BadArgumentsError, InvalidACLError, ValueError, TypeError)):
        return Fatal(f"ZooKeeper {what} {path}: rejected as invalid ({type(exc).__name__})")
    if isinstance(exc, KazooException):
        return Fatal(f"ZooKeeper {what} {path}: {type(exc).__name__} {exc}")
    if isinstance(exc, OSError):
        return Retriable(f"ZooKeeper {what} {path}: {exc}")
    return Fatal(f"ZooKeeper {what} {path}: unexpected {type(exc).__name__}: {exc}")


def describe(op: Op) -> str:
    if isinstance(op, CreateOp):
        return f"create {op.path}" + (" (ephemeral)" if op.ephemeral else "")
    if isinstance(op, SetOp):
        return f"set {op.path} at version {op.version}"
    if isinstance(op, DeleteOp):
        return f"delete {op.path} at version {op.version}"
    return f"check {op.path} at version {op.version}"
