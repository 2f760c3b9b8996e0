"""Fixtures for the cluster tests: the real ZooKeeper servers (standalone and ensembles)."""

from __future__ import annotations

from tests.fixtures.zookeeper import zk_ensemble, zk_server  # noqa: F401  (fixtures)
