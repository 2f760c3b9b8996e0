"""host:port parsing, one home for every address an operator writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadd.model.hostport import HostPort, connect_url


@pytest.mark.parametrize(("text", "want"), [
    ("127.0.0.1:9105", HostPort("127.0.0.1", 9105)),
    ("[::1]:2181", HostPort("::1", 2181)),
    ("bookie-1.example:3181", HostPort("bookie-1.example", 3181)),
])
def test_parses(text: str, want: HostPort) -> None:
    assert HostPort.parse(text) == want


@pytest.mark.parametrize("text", [
    "host", "host:", ":9105", "host:0", "host:65536", "host:٣١٨١", "::1:2181", "host:-1",
])
def test_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"host:port|port|brackets"):
        HostPort.parse(text)


def test_port_zero_only_where_a_free_port_is_wanted() -> None:
    assert HostPort.parse("127.0.0.1:0", allow_zero=True).port == 0


@pytest.mark.parametrize(("bind", "url"), [
    ("0.0.0.0:9105", "http://127.0.0.1:9105/status"),
    ("[::]:9105", "http://127.0.0.1:9105/status"),
    ("[::1]:9105", "http://[::1]:9105/status"),
    ("10.0.0.5:9105", "http://10.0.0.5:9105/status"),
])
def test_connect_url_reaches_a_wildcard_bind_on_loopback(bind: str, url: str) -> None:
    assert connect_url(bind, "/status") == url


@given(st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True) | st.ip_addresses().map(str),
       st.integers(1, 65535))
def test_round_trip(host: str, port: int) -> None:
    hp = HostPort(host, port)
    assert HostPort.parse(hp.netloc) == hp
