"""The agent's telemetry against the real llama.cpp engine on this machine (issue 32, no
Slurm): without ``--metrics`` a replica is sampled through ``/slots`` (a slot busy with a
request counts as running), with it through llama.cpp's own ``/metrics`` names."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import List

import pytest

from synthbatch.agent_stdlib.allocation.telemetry import Telemetry
from synthbatch.agent_stdlib.contracts import ReplicaTelemetry
from tests.integration.runs import llamacpp_server

pytestmark = pytest.mark.slow


def _long_request(url: str) -> None:
    body = json.dumps({"model": "smollm2", "max_tokens": 200, "temperature": 0.0,
                       "messages": [{"role": "user", "content": "Count from 1 to 100."}]})
    request = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=120).read()


def _samples_during_a_request(url: str, path: Path) -> List[ReplicaTelemetry]:
    """Every sample of the replica taken while one long request runs (and one after)."""
    telemetry = Telemetry(path, interval=0)
    telemetry.urls = {"smol": [url]}
    worker = threading.Thread(target=_long_request, args=(url,))
    worker.start()
    seen = []
    while worker.is_alive():
        telemetry.sample()
        seen.append(telemetry.record().replicas[0])
    worker.join()
    telemetry.sample()
    return seen + [telemetry.record().replicas[0]]


def test_llamacpp_without_metrics_is_sampled_through_its_slots(tmp_path: Path) -> None:
    with llamacpp_server(tmp_path, "-t", "1", "-np", "2", "-c", "1024") as url:
        with urllib.request.urlopen(url + "/slots", timeout=5) as reply:
            assert isinstance(json.loads(reply.read()), list)  # the endpoint the agent reads
        seen = _samples_during_a_request(url, tmp_path / "telemetry.json")
    assert all((r.engine, r.error) == ("llamacpp", None) for r in seen), seen
    assert all(r.waiting is None for r in seen)  # /slots says nothing of a queue
    assert max(r.running for r in seen) == 1.0 and seen[-1].running == 0.0, seen


def test_llamacpp_with_metrics_is_sampled_by_its_own_names(tmp_path: Path) -> None:
    with llamacpp_server(tmp_path, "-t", "1", "-np", "2", "-c", "1024", "--metrics") as url:
        seen = _samples_during_a_request(url, tmp_path / "telemetry.json")
    assert all((r.engine, r.error) == ("llamacpp", None) for r in seen), seen
    assert all(r.running is not None and r.waiting is not None for r in seen), seen
    assert max(r.running for r in seen) == 1.0 and seen[-1].running == 0.0, seen
    assert any(r.gen_tokens_per_s for r in seen), seen  # the predicted-tokens counter
