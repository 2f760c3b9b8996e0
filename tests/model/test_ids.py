import os
import uuid

from offloadd.model import ids


def test_random_uuid_is_a_version_4_rfc_4122_uuid() -> None:
    for _ in range(1000):
        u = ids.random_uuid()
        assert u.version == 4
        assert u.variant == uuid.RFC_4122
        assert uuid.UUID(str(u)) == u


def test_random_hex_has_the_uuid_hex_format() -> None:
    h = ids.random_hex()
    assert len(h) == 32 and h == h.lower()
    assert uuid.UUID(hex=h).version == 4


def test_ids_do_not_repeat() -> None:
    seen = {ids.random_int128() for _ in range(100_000)}
    assert len(seen) == 100_000


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(w, ids.random_hex().encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        child = os.read(r, 64).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert len(child) == 32
    assert child != ids.random_hex()
