"""Data Designer offline: the adapter never lets tiktoken download (its column profiler and
reasoning-token estimate load cl100k_base) and keeps telemetry off, so a shard with no
internet is neither delayed nor failed. Runs under the client environment's Python
(`scripts/client-env dd`); marked slow, skipped without it, failed under CI=true."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
CLIENT_PYTHON = REPO / ".work" / "client" / "dd" / "venv" / "bin" / "python"
PROBE = """
import json, os, socket, sys
sys.path.insert(0, sys.argv[1])
tried = []
def refuse(self, address, *args):
    tried.append(str(address))
    raise OSError("no network in this test")
socket.socket.connect = refuse
socket.getaddrinfo = lambda host, *a, **k: tried.append(host) or (_ for _ in ()).throw(
    OSError("no DNS in this test"))
from agent_stdlib.client.data_designer import dd_environment, keep_tiktoken_offline
os.environ.update(dd_environment(os.environ, os.path.join(sys.argv[2], "home")))
os.environ["TIKTOKEN_CACHE_DIR"] = sys.argv[2]  # an empty cache
note = keep_tiktoken_offline()
from data_designer.engine.utils.token_counting import count_text_tokens
from data_designer.engine.models import telemetry
print(json.dumps({"note": note, "tokens": count_text_tokens("Hello, offline world"),
                  "tried": tried, "telemetry": telemetry.TELEMETRY_ENABLED}))
"""


def test_tiktoken_never_downloads_and_telemetry_is_off(tmp_path):
    if not CLIENT_PYTHON.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("no Data Designer client environment: run scripts/client-env dd")
        pytest.skip("no Data Designer client environment: run scripts/client-env dd")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_", "TIKTOKEN"))}
    done = subprocess.run([str(CLIENT_PYTHON), "-c", PROBE, str(REPO), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["tried"] == []  # not one connection or name lookup
    assert report["tokens"] == 4  # the word counter: "Hello", ",", "offline", "world"
    assert report["note"] and "nothing is downloaded" in report["note"]
    assert report["telemetry"] is False
