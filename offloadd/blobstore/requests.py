"""Requests a driver sent to its store, by operation and result: what the store bills for.

Every driver counts each request it makes — each HTTP request for S3 (an operation retried three
times is three requests), each operation for the filesystem — under S3's operation names, so
one price list applies to both (:data:`PUT_CLASS`, :data:`GET_CLASS`, :data:`FREE`). Results:

============  ==============================================================
``ok``        answered with success (2xx; a 304 too)
``throttled`` S3 said slow down: 503 SlowDown, 429, or a throttling code
``server``    other 5xx
``client``    other 4xx (a 404 of a HEAD included)
``io``        no answer: the connection failed, reset, or the body broke
``timeout``   no answer in time (a socket timeout, or the operation's deadline)
============  ==============================================================

``on_request(driver, op, result)`` hears each one (the metric
``offloadd_blobstore_requests_total``); :meth:`RequestCounts.snapshot` is the running total.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping

__all__ = ["FREE", "GET_CLASS", "PUT_CLASS", "RESULTS", "OnRequest", "RequestCounts",
           "price_class"]

RESULTS = ("ok", "throttled", "server", "client", "io", "timeout")

# S3's price classes (S3 pricing page, "Requests & data retrievals"): PUT, COPY, POST and LIST
# requests at one price; GET, SELECT "and all other requests" at a tenth of it or less; DELETE
# and CANCEL (abort) requests are free.
PUT_CLASS = frozenset({"PutObject", "CopyObject", "UploadPart", "UploadPartCopy",
                       "CreateMultipartUpload", "CompleteMultipartUpload", "ListObjectsV2",
                       "ListObjects", "ListMultipartUploads", "ListParts"})
FREE = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})
GET_CLASS = frozenset({"GetObject", "HeadObject", "HeadBucket"})  # and any other request

OnRequest = Callable[[str, str, str], None]


def price_class(op: str) -> str:
    """``put``, ``get`` or ``free``: how S3 bills one request of ``op``."""
    if op in PUT_CLASS:
        return "put"
    if op in FREE:
        return "free"
    return "get"


class RequestCounts:
    """One driver's request counter."""

    def __init__(self, driver: str, on_request: OnRequest | None = None) -> None:
        self.driver = driver
        self.on_request = on_request
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def count(self, op: str, result: str) -> None:
        if result not in RESULTS:
            raise ValueError(f"unknown request result {result!r}")
        self._counts[(op, result)] += 1
        if self.on_request is not None:
            self.on_request(self.driver, op, result)

    def snapshot(self) -> Mapping[tuple[str, str], int]:
        """(op, result) -> requests so far."""
        return dict(self._counts)

    def by_class(self) -> dict[str, int]:
        """Requests so far by price class (every result: a refused request is billed too)."""
        out = {"put": 0, "get": 0, "free": 0}
        for (op, _), n in self._counts.items():
            out[price_class(op)] += n
        return out
