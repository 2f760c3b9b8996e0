"""Filesystem blob store: every object is a plain file holding exactly the object's bytes.

Layout under ``root``::

    <key>                  the object's bytes (keys may contain "/": subdirectories)
    .meta/<key>.json       {"metadata": {...}}: the user metadata, written before the data file
    .uploads/<random>      multipart uploads in progress (and sidecar temp files)

An object is visible iff its data file exists. ``complete()`` checks the parts tile
``[0, size)``, fsyncs the temp file, moves the sidecar into place, then ``os.replace``s the temp
file to ``<key>`` and fsyncs the directory: a reader sees the whole object or none of it.
Overwriting a key is not atomic across data and sidecar (objects are written once here).

Parts are written with ``os.pwritev`` at their offset straight from the caller's buffers (never
joined), each in a worker thread, so parts may arrive concurrently and in any order. Temp files
left by a crash are removed by :meth:`FilesystemBlobStore.sweep_incomplete_uploads` (gc's pass).
``list()`` reports size and mtime but not metadata (as S3's listing); ``head()`` reads the
sidecar.

Keys must be relative, without empty, ``.`` or ``..`` components, and may not start with
``.uploads`` or ``.meta``. ``OSError`` maps to ``NotFound`` (ENOENT), ``Retriable`` (disk full,
I/O error, try again) or ``Fatal`` (permissions, read-only, anything else).

Deadlines and health. File I/O runs in this store's own worker threads (daemon threads: a call
stuck on a hung mount neither starves the event loop's default executor, which the ledger source
uses, nor holds up the process's exit). Every operation has one deadline, ``request_timeout_s``
plus its bytes at ``min_transfer_rate_bytes_per_s``; one that misses it fails as ``Retriable``
naming the operation and the key (the thread may still finish its call later; an upload's file
descriptor is closed only once no thread uses it). Outcomes feed a
:class:`~offloadd.blobstore.health.StoreHealth` as the S3 driver's do: errors the disk answered
(disk full, I/O error) and missed deadlines count as failures, ``Fatal`` answers (permissions, a
read-only mount) as refusals, and its watchdog probes the root (``stat``) when the disk stops
answering. The circuit reports (``/readyz``, metrics); it does not hold writes back.

==========  =======================================================================
module      job
==========  =======================================================================
``tree``    the directory layout, errno translation, the blocking operations
``workers`` the store's daemon worker threads
``upload``  :class:`FilesystemUpload`: one object being written
``store``   :class:`FilesystemBlobStore`: deadlines, health, the protocol
==========  =======================================================================
"""

from offloadd.blobstore.filesystem.store import FilesystemBlobStore
from offloadd.blobstore.filesystem.upload import FilesystemUpload

__all__ = ["FilesystemBlobStore", "FilesystemUpload"]
