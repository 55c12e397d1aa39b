"""Engine argv rendering and the runtime-owned flags rejected in extra_args."""

from __future__ import annotations

import pytest

from synthbatch.control.config.engines import RESERVED, check_extra_args, reserved_flag
from synthbatch.control.planning.engines import engine_argv


def test_vllm_argv() -> None:
    argv = engine_argv("vllm", model="/models/llama", served_name="llama", tensor_parallel=2,
                       pipeline_parallel=2, extra_args=["--max-model-len", "8192"])
    assert argv == ("vllm", "serve", "/models/llama", "--host", "{host}", "--port", "{port}",
                    "--served-model-name", "llama", "--tensor-parallel-size", "2",
                    "--pipeline-parallel-size", "2", "--max-model-len", "8192")


def test_sglang_argv() -> None:
    argv = engine_argv("sglang", model="Qwen/Qwen2.5-7B", served_name="qwen",
                       tensor_parallel=4)
    assert argv == ("python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-7B",
                    "--host", "{host}", "--port", "{port}", "--served-model-name", "qwen",
                    "--tp-size", "4", "--pp-size", "1")


def test_llamacpp_argv() -> None:
    argv = engine_argv("llamacpp", model="/m/q.gguf", served_name="small",
                       extra_args=["-ngl", "99"])
    assert argv == ("llama-server", "-m", "/m/q.gguf", "--host", "{host}", "--port", "{port}",
                    "-a", "small", "--metrics", "-ngl", "99")


def test_executable_override() -> None:
    assert engine_argv("vllm", model="m", served_name="m",
                       executable="/opt/venv/bin/vllm")[0] == "/opt/venv/bin/vllm"
    assert engine_argv("sglang", model="m", served_name="m",
                       executable="/opt/venv/bin/python")[:3] == (
        "/opt/venv/bin/python", "-m", "sglang.launch_server")


def test_openai_is_not_rendered() -> None:
    with pytest.raises(ValueError, match="does not render"):
        engine_argv("openai", model="m", served_name="m")


@pytest.mark.parametrize("engine,arg,flag", [
    ("vllm", "--port", "--port"), ("vllm", "--port=8000", "--port"), ("vllm", "--host", "--host"),
    ("vllm", "-tp", "-tp"), ("vllm", "-tp=2", "-tp"), ("vllm", "-pp", "-pp"),
    ("vllm", "--tensor-parallel-size", "--tensor-parallel-size"),
    ("vllm", "--pipeline-parallel-size=2", "--pipeline-parallel-size"),
    ("vllm", "--model", "--model"), ("vllm", "--served-model-name", "--served-model-name"),
    ("vllm", "--api-key", "--api-key"), ("vllm", "--api-key=abc", "--api-key"),
    ("vllm", "-dp", "-dp"),
    ("sglang", "--tp-size", "--tp-size"), ("sglang", "--tp", "--tp"),
    ("sglang", "--model-path=/m", "--model-path"), ("sglang", "--pp-size", "--pp-size"),
    ("sglang", "--dp-size", "--dp-size"), ("sglang", "--port", "--port"),
    ("llamacpp", "-m", "-m"), ("llamacpp", "-a", "-a"), ("llamacpp", "--alias=x", "--alias"),
    ("llamacpp", "--hf-repo", "--hf-repo"), ("llamacpp", "--api-key-file", "--api-key-file"),
    ("openai", "--api-key", "--api-key"),
])
def test_reserved_flags(engine: str, arg: str, flag: str) -> None:
    assert reserved_flag(engine, arg) == flag
    with pytest.raises(ValueError) as info:
        check_extra_args(engine, ["--ok", arg])
    assert str(info.value).startswith(f"[1]: {flag} is set by synthbatch")
    assert "abc" not in str(info.value)


@pytest.mark.parametrize("engine,arg", [
    ("vllm", "--max-model-len"), ("vllm", "--portable"), ("vllm", "-tpx"),
    ("vllm", "--hostname-check"), ("sglang", "--mem-fraction-static"),
    ("llamacpp", "-ngl"), ("llamacpp", "-mg"), ("llamacpp", "--metrics"),
])
def test_unreserved_flags_pass(engine: str, arg: str) -> None:
    assert reserved_flag(engine, arg) is None
    check_extra_args(engine, [arg, "1"])


def test_every_engine_reserves_host_port_or_api_key() -> None:
    for engine, flags in RESERVED.items():
        assert "--api-key" in flags
        if engine != "openai":
            assert {"--host", "--port"} <= set(flags)


# --- serving environments: engines started through a venv's Python -------------------


def test_vllm_through_a_serving_python_uses_the_openai_server_module() -> None:
    argv = engine_argv("vllm", model="/m", served_name="s", tensor_parallel=2,
                       python="/env/bin/python", extra_args=["--enforce-eager"])
    assert argv == ("/env/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                    "--model", "/m", "--host", "{host}", "--port", "{port}",
                    "--served-model-name", "s", "--tensor-parallel-size", "2",
                    "--pipeline-parallel-size", "1", "--enforce-eager")


def test_llamacpp_through_a_serving_python_uses_the_agent_launcher() -> None:
    argv = engine_argv("llamacpp", model="/m.gguf", served_name="smol", python="/env/python")
    assert argv[:4] == ("/env/python", "-I", "{agent}", "serve-llamacpp")
    assert argv[4:] == ("-m", "/m.gguf", "--host", "{host}", "--port", "{port}", "-a", "smol",
                        "--metrics")


def test_sglang_through_a_serving_python() -> None:
    argv = engine_argv("sglang", model="org/m", served_name="m", python="/env/python")
    assert argv[:3] == ("/env/python", "-m", "sglang.launch_server")
