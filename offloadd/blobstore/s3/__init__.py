"""The S3 blob-store driver (``aws-s3``): any S3-compatible endpoint, through aiobotocore.

Keys: the store's ``prefix`` option is prepended to every key it is given (``prefix + key``) and
stripped from every key it lists; keys are otherwise the caller's (``offloadd.model.keys``). No
botocore or aiohttp exception leaves this package: ``NoSuchKey``/404 becomes ``NotFound``, what
can succeed later ``Retriable``, every other answer ``Fatal`` with a message saying what to check.

=============  ==============================================================================
module         job
=============  ==============================================================================
``options``    :class:`S3Options`, :class:`ReadEndpoint`: what the driver is told
``session``    one aiobotocore client per endpoint; credentials kept out of botocore's logs
``errors``     every backend exception translated into the error tree, refusals told apart
``calls``      one operation: retries, its deadline, store-health gating, endpoint choice
``checksums``  the CRC32C header of every body, the multipart ETag
``multipart``  :class:`S3MultipartUpload`; listing, aborting and sweeping incomplete uploads
``store``      :class:`S3BlobStore`: objects (put, ranged get, head, delete, list)
=============  ==============================================================================
"""

from offloadd.blobstore.s3.multipart import IncompleteUpload, S3MultipartUpload
from offloadd.blobstore.s3.options import ReadEndpoint, S3Options
from offloadd.blobstore.s3.store import S3BlobStore

__all__ = [
    "IncompleteUpload",
    "ReadEndpoint",
    "S3BlobStore",
    "S3MultipartUpload",
    "S3Options",
]
