"""Tests for fixtures/fake_openai_server.py (subprocess mode, plus a few in-process checks)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fixtures.fake_openai_server import (  # noqa: E402
    DEFAULT_MAX_TOKENS,
    chat_prompt,
    completion_tokens,
    expected_completion,
    placement_report,
    serve_in_thread,
)

SERVER = ROOT / "fixtures" / "fake_openai_server.py"
HOST = "127.0.0.1"
MODEL = "fake-model"
WAIT = 10.0  # upper bound for every poll loop; loops return as soon as the condition holds


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


class Server:
    """A fake server subprocess."""

    def __init__(self, proc: subprocess.Popen, port: int, tmp: Path) -> None:
        self.proc = proc
        self.port = port
        self.tmp = tmp

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: Optional[bytes] = None,
        timeout: float = WAIT,
    ) -> Tuple[int, Dict[str, str], bytes]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body))
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
        finally:
            conn.close()

    def post(self, path: str, body: Any) -> Tuple[int, Any]:
        status, _, payload = self.request("POST", path, body)
        return status, json.loads(payload)

    def metrics(self) -> Dict[str, float]:
        status, _, payload = self.request("GET", "/metrics")
        assert status == 200
        return parse_metrics(payload.decode())

    def stdout(self) -> str:
        return (self.tmp / "stdout.txt").read_text()


def parse_metrics(text: str) -> Dict[str, float]:
    """Map metric name (labels dropped) to value."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        assert match, line
        values[match.group(1)] = float(match.group(3))
    return values


def wait_for(predicate: Callable[[], Any], timeout: float = WAIT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def sse_events(payload: bytes) -> List[str]:
    text = payload.decode()
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


@pytest.fixture
def start_server(tmp_path: Path):
    """Factory: start_server(*flags) -> Server; every process is killed at teardown."""
    procs: List[subprocess.Popen] = []
    counter = [0]

    def start(*flags: str, wait_ready: bool = True, env: Optional[Dict[str, str]] = None) -> Server:
        counter[0] += 1
        tmp = tmp_path / f"server{counter[0]}"
        tmp.mkdir()
        port_file = tmp / "port"
        with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(SERVER), "--port", "0", "--port-file", str(port_file)]
                + list(flags),
                stdout=out,
                stderr=err,
                cwd=str(tmp),
                env=None if env is None else {**os.environ, **env},
            )
        procs.append(proc)

        def port_written() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"server exited {proc.returncode}: {(tmp / 'stderr.txt').read_text()}"
                )
            return port_file.exists()

        wait_for(port_written, what="port file")
        server = Server(proc, int(port_file.read_text()), tmp)
        if wait_ready:
            wait_for(lambda: server.request("GET", "/health")[0] == 200, what="health")
        return server

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=WAIT)


# --------------------------------------------------------------------------------------------
# pure functions
# --------------------------------------------------------------------------------------------


def test_expected_completion_is_pure_and_sized() -> None:
    text = expected_completion("m", "hello world", 7)
    assert text == expected_completion("m", "hello world", 7)
    assert len(text.split(" ")) == 7
    assert text.split(" ") == completion_tokens("m", "hello world", 7)
    assert expected_completion("m", "hello world", 0) == ""
    # A longer completion extends the shorter one (token stream is a prefix sequence).
    assert expected_completion("m", "hello world", 40).startswith(text)
    assert expected_completion("m", "hello world!", 7) != text
    assert expected_completion("other", "hello world", 7) != text
    with pytest.raises(ValueError):
        expected_completion("m", "x", -1)


def test_chat_prompt_is_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "trailing"},
    ]
    assert chat_prompt(messages) == "a\nb"
    assert chat_prompt([{"role": "system", "content": "only"}]) == ""


# --------------------------------------------------------------------------------------------
# endpoints
# --------------------------------------------------------------------------------------------


def test_health_models_metrics_and_stdout_line(start_server) -> None:
    server = start_server("--model", "my-model")
    status, _, body = server.request("GET", "/health")
    assert (status, body) == (200, b"")
    status, headers, body = server.request("GET", "/v1/models")
    assert status == 200
    assert headers["content-type"] == "application/json"
    models = json.loads(body)
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["my-model"]
    assert models["data"][0]["object"] == "model"
    status, _, body = server.request("GET", "/metrics")
    text = body.decode()
    assert 'vllm:num_requests_running{model_name="my-model"} 0.0' in text
    assert 'vllm:num_requests_waiting{model_name="my-model"} 0.0' in text
    assert parse_metrics(text)["vllm:request_success_total"] == 0
    assert (
        server.stdout() == f"fake-openai-server listening on {HOST}:{server.port} model=my-model\n"
    )
    status, _, _ = server.request("GET", "/nope")
    assert status == 404


def test_models_and_stderr_report_the_gpus_and_node_it_runs_on(start_server) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_GPUS": "6,7", "SLURMD_NODENAME": "node1",
           "GPU_DEVICE_ORDINAL": "2,3"}
    server = start_server(env={**env, "ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "9"})
    report = {"cuda_visible_devices": "2,3", "rocr_visible_devices": "",
              "hip_visible_devices": "9", "gpu_device_ordinal": "2,3",
              "slurm_step_gpus": "6,7", "node": "node1"}
    status, _, body = server.request("GET", "/v1/models")
    entry = json.loads(body)["data"][0]
    assert status == 200 and entry["synthbatch_test"] == report
    assert entry["id"] == MODEL and entry["owned_by"] == "vllm"  # the vLLM fields stay
    stderr = (server.tmp / "stderr.txt").read_text()
    assert f"fake-openai-server placement {json.dumps(report, sort_keys=True)}\n" in stderr
    bare = {k: v for k, v in os.environ.items()
            if k not in env and k not in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
    assert placement_report(bare) == dict.fromkeys(report)  # unset: None, never ""


def test_completion_is_deterministic(start_server) -> None:
    server = start_server()
    request = {"model": MODEL, "prompt": "Write a poem about Slurm", "max_tokens": 12}
    status, first = server.post("/v1/completions", request)
    assert status == 200
    status, second = server.post("/v1/completions", request)
    assert status == 200
    text = first["choices"][0]["text"]
    assert text == second["choices"][0]["text"]
    assert text == expected_completion(MODEL, "Write a poem about Slurm", 12)
    assert first["object"] == "text_completion"
    assert first["model"] == MODEL
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}

    # Default max_tokens, model omitted, list prompt -> one choice per prompt.
    status, body = server.post("/v1/completions", {"prompt": ["a b", "c"]})
    assert status == 200
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["text"] for c in body["choices"]] == [
        expected_completion(MODEL, "a b", DEFAULT_MAX_TOKENS),
        expected_completion(MODEL, "c", DEFAULT_MAX_TOKENS),
    ]
    assert body["usage"]["completion_tokens"] == 2 * DEFAULT_MAX_TOKENS
    assert server.metrics()["vllm:request_success_total"] == 3


def test_chat_completion_uses_last_user_message(start_server) -> None:
    server = start_server()
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "Name three rivers"},
    ]
    status, body = server.post(
        "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 5}
    )
    assert status == 200
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == expected_completion(MODEL, "Name three rivers", 5)
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_streaming_completion_chunks_and_done(start_server) -> None:
    server = start_server("--token-latency", "0.001")
    conn = http.client.HTTPConnection(HOST, server.port, timeout=WAIT)
    try:
        # Several requests over one keep-alive connection: JSON, stream, JSON.
        for stream in (False, True, False):
            conn.request(
                "POST",
                "/v1/completions",
                body=json.dumps(
                    {"model": MODEL, "prompt": "p q", "max_tokens": 6, "stream": stream}
                ),
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            payload = resp.read()
            assert resp.status == 200
            if not stream:
                assert resp.getheader("Content-Length") == str(len(payload))
                continue
            assert resp.getheader("Transfer-Encoding") == "chunked"
            assert resp.getheader("Content-Type").startswith("text/event-stream")
            events = sse_events(payload)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert all(c["object"] == "text_completion" for c in chunks)
            assert len({c["id"] for c in chunks}) == 1
            texts = [c["choices"][0]["text"] for c in chunks]
            assert len(texts) == 7  # one chunk per token, then the finishing chunk
            assert "".join(texts) == expected_completion(MODEL, "p q", 6)
            assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 6 + ["length"]
    finally:
        conn.close()


def test_streaming_chat_with_usage(start_server) -> None:
    server = start_server()
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "stream me"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, headers, payload = server.request("POST", "/v1/chat/completions", request)
    assert status == 200
    events = sse_events(payload)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 4
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert content == expected_completion(MODEL, "stream me", 4)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_error_responses(start_server) -> None:
    server = start_server()
    status, body = server.post("/v1/completions", {"model": "nope", "prompt": "x"})
    assert status == 404
    assert body["object"] == "error"
    assert body["code"] == 404
    assert "nope" in body["message"]
    status, _, payload = server.request("POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400
    assert json.loads(payload)["type"] == "BadRequestError"
    status, _ = server.post("/v1/completions", {"prompt": "x", "max_tokens": -2})
    assert status == 400
    status, _ = server.post("/v1/chat/completions", {"messages": []})
    assert status == 400
    assert server.metrics()["vllm:request_success_total"] == 0


# --------------------------------------------------------------------------------------------
# concurrency
# --------------------------------------------------------------------------------------------


def _hold_stream(port: int, prompt: str) -> http.client.HTTPConnection:
    """Send a long streaming request without reading the response; caller closes it."""
    conn = http.client.HTTPConnection(HOST, port, timeout=WAIT)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 100000, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body))
    return conn


def queue_is(server: Server, running: int, waiting: int) -> bool:
    metrics = server.metrics()
    return (
        metrics["vllm:num_requests_running"] == running
        and metrics["vllm:num_requests_waiting"] == waiting
    )


def test_metrics_waiting_under_max_concurrency(start_server) -> None:
    server = start_server("--max-concurrency", "1", "--token-latency", "0.01")
    conns = [_hold_stream(server.port, f"hold {i}") for i in range(3)]
    try:
        wait_for(lambda: queue_is(server, 1, 2), what="1 running and 2 waiting")
    finally:
        for conn in conns:
            conn.close()
    # Disconnected clients are noticed and the queue drains.
    wait_for(lambda: queue_is(server, 0, 0), what="queue to drain")
    status, body = server.post("/v1/completions", {"prompt": "after", "max_tokens": 2})
    assert status == 200
    assert body["choices"][0]["text"] == expected_completion(MODEL, "after", 2)


def test_concurrent_requests_all_served(start_server) -> None:
    server = start_server("--max-concurrency", "2", "--token-latency", "0.005")
    results: Dict[int, Tuple[int, Any]] = {}

    def worker(i: int) -> None:
        results[i] = server.post("/v1/completions", {"prompt": f"prompt {i}", "max_tokens": 8})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT)
    assert sorted(results) == list(range(6))
    for i, (status, body) in results.items():
        assert status == 200
        assert body["choices"][0]["text"] == expected_completion(MODEL, f"prompt {i}", 8)
    metrics = server.metrics()
    assert metrics["vllm:request_success_total"] == 6
    assert metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:num_requests_running"] == 0
    assert metrics["vllm:generation_tokens_total"] == 48


def test_reject_when_waiting(start_server) -> None:
    server = start_server(
        "--max-concurrency", "1", "--reject-when-waiting", "0", "--token-latency", "0.01"
    )
    holder = _hold_stream(server.port, "hold")
    try:
        wait_for(lambda: server.metrics()["vllm:num_requests_running"] == 1, what="holder")
        status, headers, payload = server.request("POST", "/v1/completions", {"prompt": "x"})
        assert status == 429
        assert headers["retry-after"] == "1"
        assert json.loads(payload)["code"] == 429
    finally:
        holder.close()


# --------------------------------------------------------------------------------------------
# fault injection, startup, logging, signals
# --------------------------------------------------------------------------------------------


def test_exit_after_exits_with_status_3(start_server) -> None:
    server = start_server("--exit-after", "2")
    status, body = server.post("/v1/completions", {"prompt": "one", "max_tokens": 3})
    assert status == 200
    status, body = server.post("/v1/completions", {"prompt": "two", "max_tokens": 3})
    assert status == 200
    assert body["choices"][0]["text"] == expected_completion(MODEL, "two", 3)
    assert server.proc.wait(timeout=WAIT) == 3


def test_fail_every_gives_500(start_server) -> None:
    server = start_server("--fail-every", "3")
    statuses = [
        server.post("/v1/completions", {"prompt": f"p{i}", "max_tokens": 1})[0] for i in range(6)
    ]
    assert statuses == [200, 200, 500, 200, 200, 500]
    status, body = server.post("/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert status == 200
    assert server.metrics()["vllm:request_success_total"] == 5


def test_startup_delay_503_then_200(start_server) -> None:
    server = start_server("--startup-delay", "0.8", wait_ready=False)
    status, headers, _ = server.request("GET", "/health")
    assert status == 503
    status, body = server.post("/v1/completions", {"prompt": "early"})
    assert status == 503
    assert body["code"] == 503
    wait_for(lambda: server.request("GET", "/health")[0] == 200, what="ready")
    status, _ = server.post("/v1/completions", {"prompt": "late"})
    assert status == 200


def test_request_log_lines(start_server, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    server = start_server("--request-log", str(log), "--fail-every", "2")
    server.post("/v1/completions", {"prompt": "alpha", "max_tokens": 2})
    server.post("/v1/completions", {"prompt": "beta", "max_tokens": 2})
    chat = {"messages": [{"role": "user", "content": "gamma"}], "stream": True}
    assert server.request("POST", "/v1/chat/completions", chat)[0] == 200
    server.post("/v1/completions", {"model": "unknown", "prompt": "delta"})
    server.request("GET", "/metrics")  # not logged
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["endpoint"], e["prompt"], e["status"]) for e in lines] == [
        ("/v1/completions", "alpha", 200),
        ("/v1/completions", "beta", 500),
        ("/v1/chat/completions", "gamma", 200),
        ("/v1/completions", "delta", 404),
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_cleanly(start_server, signum: int) -> None:
    server = start_server()
    server.proc.send_signal(signum)
    assert server.proc.wait(timeout=WAIT) == 0


def test_serve_in_thread(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    with serve_in_thread(model="inproc", port_file=str(port_file)) as running:
        assert int(port_file.read_text()) == running.port
        conn = http.client.HTTPConnection(HOST, running.port, timeout=WAIT)
        try:
            body = {"model": "inproc", "prompt": "hi", "max_tokens": 3}
            conn.request("POST", "/v1/completions", body=json.dumps(body))
            resp = conn.getresponse()
            data = json.loads(resp.read())
        finally:
            conn.close()
        assert resp.status == 200
        assert data["choices"][0]["text"] == expected_completion("inproc", "hi", 3)


class _CountingWriter:
    """The handler's socket writer, counting the sends it makes."""

    def __init__(self, inner: Any, sends: List[int]) -> None:
        self._inner, self._sends = inner, sends

    def write(self, data: bytes) -> int:
        self._sends.append(len(data))
        return self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_keep_alive_responses_leave_in_one_send_on_a_nodelay_socket() -> None:
    """Like uvicorn: TCP_NODELAY on every accepted socket, head and body in one send (two
    sends without NODELAY stall each kept-alive response ~40 ms on delayed ACK)."""
    nodelay: List[int] = []
    sends: List[int] = []
    with serve_in_thread(model=MODEL) as running:
        base = running.server.RequestHandlerClass

        class Observed(base):  # type: ignore[misc, valid-type]
            def setup(self) -> None:
                super().setup()
                nodelay.append(self.connection.getsockopt(socket.IPPROTO_TCP,
                                                          socket.TCP_NODELAY))
                self.wfile = _CountingWriter(self.wfile, sends)

        running.server.RequestHandlerClass = Observed
        conn = http.client.HTTPConnection(HOST, running.port, timeout=WAIT)
        try:
            for i in range(20):
                if i % 2:
                    conn.request("GET", "/health")
                else:
                    body = {"model": MODEL, "prompt": f"p{i}", "max_tokens": 2}
                    conn.request("POST", "/v1/completions", body=json.dumps(body))
                response = conn.getresponse()
                assert response.status == 200 and response.getheader("Connection") is None
                response.read()
        finally:
            conn.close()
    assert nodelay == [1]  # one kept-alive connection, NODELAY set
    assert len(sends) == 20  # one send per response (was two: head, then body)
