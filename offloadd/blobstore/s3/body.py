"""The body of an ``UploadPart`` or ``PutObject``: :class:`Body`, the part's buffers joined once.

Handed to botocore as ``bytes``, a body is copied three times before TLS sees it: the join of
the part's buffers, botocore's ``BytesIO`` around it (its ``convert_body_to_file_like_object``),
whose ``getbuffer()`` in aiohttp's ``BytesIOPayload`` copies the shared bytes again, and the
64 KiB ``read()`` chunks aiohttp sends. In a profile of the S3 path at 64 KiB entries the first
two were about 1.2 user-s/GiB of the event loop's time. A :class:`Body` is joined once and sent
as it is: it is an aiohttp ``Payload`` (written in 64 KiB views of its bytes), and it has the
file's ``read``/``seek``/``tell`` that botocore asks of a body — so botocore still sends
``Expect: 100-continue`` (see ``calls.py``, "Deadlines"), takes the length from it, and over
plain HTTP reads it for the SigV4 payload hash.
"""

from __future__ import annotations

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

from offloadd.blobstore.base import Buffers

CHUNK = 64 * 1024  # aiohttp's own chunk for in-memory bodies


class Body(Payload):
    """``data`` joined, as a request body (see the module docstring); reusable by retries."""

    _value: bytes
    _autoclose = True  # bytes in memory: nothing to close

    def __init__(self, data: Buffers | bytes) -> None:
        value = data if isinstance(data, bytes) else b"".join(data)
        super().__init__(value, content_type="application/octet-stream")
        self._size = len(value)
        self._pos = 0

    @property
    def data(self) -> bytes:
        return self._value

    def __len__(self) -> int:
        return len(self._value)

    # ---- the file botocore reads ----------------------------------------------------------

    def read(self, n: int = -1) -> bytes:
        start = self._pos
        end = len(self._value) if n is None or n < 0 else min(start + n, len(self._value))
        self._pos = max(end, start)
        return self._value[start:end]

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._value))[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    # ---- the payload aiohttp writes ---------------------------------------------------------

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._value.decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter,
                                content_length: int | None) -> None:
        # In slices (views: no copy), as aiohttp's own BytesIOPayload sends: TLS encrypts
        # each while it is in cache, where one write of a whole part is encrypted into a
        # growing memory buffer first (7 times the CPU in a profile).
        view = memoryview(self._value)
        if content_length is not None:
            view = view[:content_length]
        for at in range(0, len(view), CHUNK):
            await writer.write(view[at:at + CHUNK])

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self._value
