"""The commit stage runs on every metadata store: the metadata contract suite's openers."""

from tests.fixtures.zookeeper import zk_ensemble, zk_server  # noqa: F401  (fixtures)
from tests.metadata.conftest import open_session, store  # noqa: F401  (fixtures)
