"""Configuration: one TOML file plus ``OFFLOADD_...`` environment overrides (docs/config.md).

Precedence, highest first: environment (``OFFLOADD_OFFLOAD__FLOW_PERMITS_PER_SECOND=...``, nested
keys joined by ``__``), the TOML file, defaults. Offload policy fields resolve per field
topic → namespace → broker (``[topics."persistent://t/ns/x"]``, ``[namespaces."t/ns"]``,
``[offload]``), like Pulsar's offload policies. Keys are snake_case; Pulsar's camelCase names are
accepted as aliases where one exists. Unknown keys are errors (a typo must not be ignored).

============  ===============================================================================
module        job
============  ===============================================================================
``fields``    the sections' base model, Pulsar alias names, how a key is written
``sections``  one model per section (``[metadata]``, ``[source]``, ``[blobstore]``...)
``policy``    the offload policy: ``[offload]`` and the namespace and topic levels over it
``settings``  :class:`Settings`: every section, the levels resolved, the checks across keys
``keys``      the key space: a section's model, Pulsar's aliases, which keys are secrets
``loading``   :func:`load`: the file, the environment, one-line errors
``reference`` :func:`reference_markdown`, the generated ``docs/config.md``
============  ===============================================================================
"""

from offloadd.config.keys import secret_values
from offloadd.config.loading import load
from offloadd.config.policy import OffloadPolicy, OffloadSettings, PolicyOverride
from offloadd.config.reference import reference_markdown
from offloadd.config.sections import (
    S3_MIN_PART_SIZE,
    BlobstoreSettings,
    DaemonSettings,
    LakehouseSettings,
    MetadataSettings,
    MetricsSettings,
    ReadEndpointSettings,
    RetentionSettings,
    SourceSettings,
)
from offloadd.config.settings import ORPHAN_GRACE_FACTOR, Settings
from offloadd.errors import ConfigError
from offloadd.model.sizes import MiB

__all__ = [
    "ORPHAN_GRACE_FACTOR",
    "S3_MIN_PART_SIZE",
    "BlobstoreSettings",
    "ConfigError",
    "DaemonSettings",
    "LakehouseSettings",
    "MetadataSettings",
    "MetricsSettings",
    "MiB",
    "OffloadPolicy",
    "OffloadSettings",
    "PolicyOverride",
    "ReadEndpointSettings",
    "RetentionSettings",
    "Settings",
    "SourceSettings",
    "load",
    "reference_markdown",
    "secret_values",
]
