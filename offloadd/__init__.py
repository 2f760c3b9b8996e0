"""offloadd: stream a managed ledger into object storage in Pulsar's offload formats.

The package reads like the data flow::

    ledger/ (source) -> offload/ (buffer, roller, blocks, upload, commit) -> blobstore/ + metadata/
    read/ <- blobstore/ + metadata/

``format/`` holds the pure byte formats every stage shares.
"""

__version__ = "0.1.0"
