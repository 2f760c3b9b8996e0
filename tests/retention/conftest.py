"""Real-server fixtures for the retention tests (moto's S3 over HTTP)."""

from tests.fixtures.s3 import moto_server, s3_bucket

__all__ = ["moto_server", "s3_bucket"]
