"""Fixtures of the proxy tests: backends, proxies and fake engines, closed after each test."""

from __future__ import annotations

from typing import Callable, Iterator, List

import pytest

from fixtures.fake_openai_server import RunningServer, serve_in_thread
from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.main import Proxy
from tests.unit.agent.proxy.harness import Backend


@pytest.fixture
def backends() -> Iterator[Callable[..., Backend]]:
    made: List[Backend] = []

    def make(*args: object, **kwargs: object) -> Backend:
        be = Backend(*args, **kwargs)  # type: ignore[arg-type]
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


@pytest.fixture
def proxy() -> Iterator[Callable[..., Proxy]]:
    made: List[Proxy] = []

    def make(urls: List[str], **kwargs: object) -> Proxy:
        p = Proxy(ProxyConfig(backends=urls, **kwargs))  # type: ignore[arg-type]
        p.start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture
def fake_servers() -> Iterator[Callable[..., RunningServer]]:
    made: List[RunningServer] = []

    def make(**options: object) -> RunningServer:
        server = serve_in_thread(**options)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()
