"""Retention and garbage collection: ``policy`` decides (pure), ``gc`` deletes.

See :mod:`offloadd.retention.policy` for the records and rules, :mod:`offloadd.retention.gc`
for the pass that applies them, and docs/retention.md for the operator's view.
"""
