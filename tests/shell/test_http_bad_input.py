"""Hostile input at the daemon's HTTP port (issue 23, item 11): a malformed request is one
WARNING line without a traceback, not an ERROR per request; nested JSON is a 400, not a 500;
``{"topics": []}`` closes nothing instead of every topic."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest

from offloadd.metrics import Metrics
from offloadd.shell.httpserver import MetricsServer


class Served:
    def __init__(self) -> None:
        self.calls: list[list[str] | None] = []
        self.server: MetricsServer | None = None

    async def offload_now(self, topics: list[str] | None, wait: bool,
                          timeout_s: float) -> list[Mapping[str, Any]]:
        self.calls.append(topics)
        return [{"topic": t, "result": "committed"} for t in topics or ["all"]]

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async def ready() -> tuple[bool, str]:
        return True, "ok"

    s = Served()
    s.server = MetricsServer("127.0.0.1:0", metrics=Metrics(), ready=ready,
                             offload_now=s.offload_now)
    await s.server.start()
    try:
        yield s
    finally:
        await s.server.stop()


async def _raw(port: int, data: bytes) -> bytes:
    """Send bytes that are not a valid HTTP request; the server's answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.timeout(30)
async def test_malformed_requests_log_one_warning_without_a_traceback(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    assert served.server is not None
    caplog.set_level(logging.DEBUG)
    for _ in range(20):
        answer = await _raw(served.server.port, b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        assert answer.split(b" ", 2)[1] == b"400"
    # the port still answers after the flood
    async with aiohttp.ClientSession() as http, http.get(served.url + "/healthz") as r:
        assert r.status == 200
    server_lines = [r for r in caplog.records if r.name.startswith("aiohttp")]
    assert not [r for r in server_lines if r.levelno >= logging.ERROR], \
        [r.getMessage() for r in server_lines]
    assert not [r for r in server_lines if r.exc_info], "a traceback was logged"
    warnings = [r for r in server_lines if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # rate-limited: one line for the 20 requests
    assert "malformed HTTP request" in warnings[0].getMessage()
    assert "127.0.0.1" in warnings[0].getMessage()


@pytest.mark.timeout(30)
async def test_nested_json_answers_400_and_an_empty_topic_list_closes_nothing(
        served: Served) -> None:
    async with aiohttp.ClientSession() as http:
        url = served.url + "/offload-now"
        async with http.post(url, data=b"[" * 100_000 + b"]" * 100_000,
                             headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert "nested" in (await r.json())["error"]
        async with http.post(url, json={"topics": []}) as r:
            assert r.status == 400
            assert "empty" in (await r.json())["error"]
        assert served.calls == []  # neither reached the daemon
        async with http.post(url, json={"topics": None}) as r:  # what offload-now sends
            assert r.status == 200
        async with http.post(url, json={"topics": ["persistent://public/default/t"]}) as r:
            assert r.status == 200
    assert served.calls == [None, ["persistent://public/default/t"]]
