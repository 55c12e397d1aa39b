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


def run_probe(probe: str, tmp_path) -> dict:
    """Run ``probe`` under the client environment's Python (no NEMO_/TIKTOKEN variables);
    its last line of output, as JSON."""
    if not CLIENT_PYTHON.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("no Data Designer client environment: run scripts/client-env dd")
        pytest.skip("no Data Designer client environment: run scripts/client-env dd")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_", "TIKTOKEN"))}
    done = subprocess.run([str(CLIENT_PYTHON), "-c", probe, str(REPO), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_tiktoken_never_downloads_and_telemetry_is_off(tmp_path):
    report = run_probe(PROBE, tmp_path)
    assert report["tried"] == []  # not one connection or name lookup
    assert report["tokens"] == 4  # the word counter: "Hello", ",", "offline", "world"
    assert report["note"] and "nothing is downloaded" in report["note"]
    assert report["telemetry"] is False


RULE_PROBE = """
import hashlib, inspect, json, os, socket, sys
sys.path.insert(0, sys.argv[1])
def refuse(*args, **kwargs):
    raise OSError("no network in this test")
socket.socket.connect = refuse
socket.getaddrinfo = refuse
from agent_stdlib.client import data_designer as adapter
from agent_stdlib.client.data_designer import CL100K_SHA256, CL100K_URL, cl100k_cached
import tiktoken.load, tiktoken_ext.openai_public
body = b"Y2wxMDBr 0\\n"
os.environ["TIKTOKEN_CACHE_DIR"] = sys.argv[2]
key = hashlib.sha1(CL100K_URL.encode()).hexdigest()
with open(os.path.join(sys.argv[2], key), "wb") as f:
    f.write(body)
read = tiktoken.load.read_file_cached(CL100K_URL, hashlib.sha256(body).hexdigest())
source = inspect.getsource(tiktoken_ext.openai_public.cl100k_base)
adapter.CL100K_SHA256 = hashlib.sha256(body).hexdigest()  # the planted file counts as it
print(json.dumps({"read": read == body, "url": CL100K_URL in source,
                  "hash": CL100K_SHA256 in source, "ours": cl100k_cached(os.environ)}))
"""


def test_the_adapter_reads_tiktoken_s_cache_rule_as_the_installed_tiktoken_does(tmp_path):
    """The adapter's copy of tiktoken's cache rule (it checks the file instead of letting
    tiktoken try): the same file name and folder, cl100k_base's URL and hash."""
    report = run_probe(RULE_PROBE, tmp_path)
    # tiktoken read the planted file from where the adapter looks (no download: no network)
    assert report["read"] is True
    assert report["url"] is True and report["hash"] is True
    assert report["ours"] is True  # the adapter finds that same file


REFUSED_PROBE = """
import hashlib, json, os, sys
sys.path.insert(0, sys.argv[1])
seen, passed = [], []
sys.addaudithook(lambda event, args: event.startswith("socket.") and seen.append(event))
from agent_stdlib.client import data_designer as adapter
adapter.refuse_network_while_offline()
sys.addaudithook(lambda event, args: event.startswith("socket.") and passed.append(event))
os.environ.update(adapter.dd_environment(os.environ, os.path.join(sys.argv[2], "home")))
os.environ["TIKTOKEN_CACHE_DIR"] = sys.argv[2]
body = b"Y2wxMDBr 0\\n"  # not cl100k_base: tiktoken itself would download the real file
key = hashlib.sha1(adapter.CL100K_URL.encode()).hexdigest()
with open(os.path.join(sys.argv[2], key), "wb") as f:
    f.write(body)
adapter.CL100K_SHA256 = hashlib.sha256(body).hexdigest()  # the adapter thinks it cached
note = adapter.keep_tiktoken_offline()
from data_designer.engine.utils.token_counting import count_text_tokens
print(json.dumps({"note": note, "tokens": count_text_tokens("Hello, offline world"),
                  "seen": seen, "passed": passed}))
"""


def test_a_tiktoken_that_reaches_for_the_network_anyway_is_refused_it(tmp_path):
    """Should the adapter's copy of tiktoken's cache rule be wrong, the download tiktoken
    then starts is refused before its first name lookup, and the word counter stands in."""
    report = run_probe(REFUSED_PROBE, tmp_path)
    assert "socket.getaddrinfo" in report["seen"]  # tiktoken did try to download
    # no name lookup or connection got past the refusal (urllib3's IPv6 check may create and
    # bind a socket to ::1 first: nothing leaves the host)
    assert not {"socket.getaddrinfo", "socket.connect"} & set(report["passed"]), report
    assert report["tokens"] == 4 and "nothing is downloaded" in report["note"]
