"""Blob stores: the protocol plus the drivers that need only the standard library.

The S3 driver lives in :mod:`offloadd.blobstore.s3` and is imported from there, so importing this
package never pulls in aiobotocore.
"""

from offloadd.blobstore.base import BlobStore, Buffers, MultipartUpload, ObjectInfo
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.blobstore.memory import MemoryBlobStore

__all__ = [
    "BlobStore",
    "Buffers",
    "FilesystemBlobStore",
    "MemoryBlobStore",
    "MultipartUpload",
    "ObjectInfo",
]
