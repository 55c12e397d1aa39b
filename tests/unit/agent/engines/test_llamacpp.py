"""The xllamacpp launcher: llama-server-compatible flags -> CommonParams."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from synthbatch.agent_stdlib.engines.llamacpp import build_parser, make_params


class FakeParams:
    def __init__(self) -> None:
        self.model = SimpleNamespace(path="")
        self.cpuparams = SimpleNamespace(n_threads=-1)
        self.hostnames, self.port, self.model_alias = ["0.0.0.0"], 0, set()
        self.n_parallel, self.n_ctx, self.endpoint_metrics = 1, 0, False


def test_flags_map_onto_common_params() -> None:
    args = build_parser().parse_args(
        ["-m", "/models/x.gguf", "--host", "127.0.0.1", "--port", "8011", "-a", "smol",
         "-t", "2", "-np", "4", "-c", "1024", "--metrics"])
    params = make_params(SimpleNamespace(CommonParams=FakeParams), args)
    assert params.model.path == "/models/x.gguf"
    assert params.hostnames == ["127.0.0.1"] and params.port == 8011
    assert params.model_alias == {"smol"} and params.n_parallel == 4
    assert params.n_ctx == 1024 and params.cpuparams.n_threads == 2
    assert params.endpoint_metrics is True


def test_without_alias_the_default_name_is_kept() -> None:
    args = build_parser().parse_args(["-m", "/m.gguf", "--port", "1"])
    params = make_params(SimpleNamespace(CommonParams=FakeParams), args)
    assert params.model_alias == set() and params.endpoint_metrics is False


def test_missing_xllamacpp_is_a_clear_error(agent_pyz, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(agent_pyz), "serve-llamacpp", "-m", "/m.gguf",
         "--port", "1"], capture_output=True, text=True, timeout=60,
        env={"SHIV_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "xllamacpp package is not installed" in proc.stderr
