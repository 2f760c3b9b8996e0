"""The error tree every module raises; backend exceptions never escape a driver.

::

    OffloaddError
     ├── ConfigError            bad configuration (exit code 2)
     ├── FormatError            bytes that do not parse (names the object and byte offset)
     ├── OversizeEntryError     an entry that cannot be placed in a block
     ├── NotFound               object, znode, topic or ledger does not exist
     ├── Conflict               compare-and-set lost (BadVersion), node or object already exists
     ├── Fenced                 a newer owner/epoch holds the topic; this writer must stop
     ├── IllegalTransition      a segment state change the state table refuses (a defect)
     ├── Retriable              transient backend failure: retry with backoff
     └── Fatal                  permanent backend failure: retrying will not help
"""

from __future__ import annotations


class OffloaddError(Exception):
    """Base of every error offloadd raises on purpose."""


class ConfigError(OffloaddError):
    """Invalid configuration; the message names the key, the file and what is allowed."""


class FormatError(OffloaddError):
    """Bytes that do not decode. Carries the object name and the byte offset of the problem."""

    def __init__(self, obj: str, offset: int, problem: str) -> None:
        self.obj = obj
        self.offset = offset
        self.problem = problem
        super().__init__(f"{obj} at byte {offset}: {problem}")


class OversizeEntryError(OffloaddError):
    """An entry larger than the configured maximum; refused instead of silently dropped."""


class NotFound(OffloaddError):
    """The named object, node, topic or ledger does not exist."""


class Conflict(OffloaddError):
    """A compare-and-set lost its race (bad version), or a node or object to create (a
    create-only write: the store as a second fence) already exists."""


class Fenced(OffloaddError):
    """Another owner (newer epoch) holds the topic; the caller must abandon its work."""


class IllegalTransition(OffloaddError):
    """A segment state change that :mod:`offloadd.model.segment_state`'s table refuses. Raised
    inside a catalog edit, it abandons the edit (nothing is written) and fails that attempt."""


class Retriable(OffloaddError):
    """A transient backend failure (timeouts, 5xx, lost connection)."""


class Fatal(OffloaddError):
    """A permanent backend failure (access denied, bad request, corrupt data at rest)."""
