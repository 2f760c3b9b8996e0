"""offloadd: stream a managed ledger into object storage in Pulsar's offload formats.

The package reads like the data flow (docs/design.md draws the map)::

    ledger/ (source) -> offload/ (runs, attempt, upload) -> blobstore/
                        commit/ (fenced compare-and-set of the catalog) -> metadata/
    read/ <- blobstore/ + metadata/;  retention/ deletes;  shell/: the commands, the process

``model/`` holds the pure values and ``format/`` the pure byte formats every stage shares.
"""

__version__ = "0.1.0"
