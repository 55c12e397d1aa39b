"""The proxy's command line: port file, SIGTERM, bad arguments."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys

from tests.conftest import REPO
from tests.unit.agent.proxy.harness import (
    WAIT,
    wait_for,
)

# --------------------------------------------------------------------------------------
# CLI


def test_main_subprocess_port_file_and_sigterm(backends, tmp_path) -> None:
    be = backends()
    port_file = tmp_path / "proxy.port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "synthbatch.agent_stdlib",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            be.url,
            "--port-file",
            str(port_file),
            "--max-queued",
            "100",
        ],
        cwd=str(REPO),
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_for(port_file.exists, what="port file")
        port = int(port_file.read_text())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["status"] == "ok"
        conn.request("POST", "/v1/completions", body=b"hi")
        assert conn.getresponse().read() == b"hi"
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "listening on 127.0.0.1:" in err
    assert list(tmp_path.iterdir()) == [port_file]  # no temp file left behind


def test_main_bad_arguments_return_nonzero() -> None:
    from synthbatch.agent_stdlib.proxy.main import main

    assert main([]) == 2
    assert main(["--backend", "ftp://x", "--listen", "127.0.0.1:0"]) == 1


