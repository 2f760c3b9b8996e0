"""The lakehouse tests: S3 ones share the session's moto_server and get a bucket each."""

from __future__ import annotations

from tests.fixtures.s3 import moto_server, s3_bucket

__all__ = ["moto_server", "s3_bucket"]
