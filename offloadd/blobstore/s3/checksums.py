"""Integrity of what the S3 driver sends: the CRC32C header and the multipart ETag.

Every part and every ``put`` carries ``x-amz-checksum-crc32c``: S3 rejects a body whose bytes
do not match (``BadDigest``, retried), and the completed object keeps a composite CRC32C. The
uploader passes the CRC32C it combined from the blocks' own (``offload/parts.py``: each block's
was stamped from the CRCs the source computed as it read the bytes), so a data part costs no
pass over its bytes here; without one (index objects, the probe) it is computed here with the
``crc32c`` package. The header is then derived from the bytes as they were read, not as they
are sent: a part whose bytes changed in between is refused by S3. botocore's own
``ChecksumAlgorithm="CRC32C"`` path needs ``awscrt`` (not installed) and its default would add a
CRC32 of its own; computing the header ourselves avoids both. Content-MD5 would cost a second
hash of every byte for no stronger check. For the same reason bodies sent over HTTPS are not
SHA-256 signed (SigV4's ``UNSIGNED-PAYLOAD``): TLS and the CRC32C header already protect them,
and botocore, which skips the hash only when it computed the checksum itself, would otherwise
spend about a second of CPU per GiB uploaded. Over plain HTTP botocore signs every body.
"""

from __future__ import annotations

import base64
import hashlib
import re

import crc32c

_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")


def crc32c_b64(data: bytes, known: int | None = None) -> str:
    """The value of an ``x-amz-checksum-crc32c`` header for ``data``; ``known``: its CRC32C as
    the caller derived it (from the blocks' own), sent as it is, not checked here."""
    crc = crc32c.crc32c(data) if known is None else known
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def multipart_etag(etags: list[str]) -> str | None:
    """The ETag S3 gives a completed multipart object: MD5 of the parts' MD5s, dash, count
    (None when a part's ETag is not an MD5, as with SSE-KMS)."""
    digests = [e.strip('"') for e in etags]
    if not all(_MD5_ETAG.match(d) for d in digests):
        return None
    md5 = hashlib.md5(b"".join(bytes.fromhex(d) for d in digests), usedforsecurity=False)
    return f"{md5.hexdigest()}-{len(digests)}"
