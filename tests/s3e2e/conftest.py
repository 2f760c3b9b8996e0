"""The S3 end-to-end tests share one moto_server (session scope) and get a fresh bucket each."""

from __future__ import annotations

from tests.fixtures.s3 import moto_server, s3_bucket

__all__ = ["moto_server", "s3_bucket"]
