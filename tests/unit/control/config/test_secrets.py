"""Literal secrets judged by value and name, and a redactor that replaces values only."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.control.config.loader import load_model
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import one_line
from synthbatch.control.secrets import credential, literal_secret, redact, redact_text
from tests.fakes import run_data, write_json

HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
SK = "sk-" + "proj1234567890abcdefXYZ"
JWT = "eyJ" + "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig"
RANDOM = "q7Vx2LmR9sKp4TzWb8NcY3hJd6FgA1eU"  # 32 characters, base62
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize("name, value", [
    ("HO_TOKEN_LATENCY", "0.05"),          # a setting about tokens, not a token
    ("X_SECRET_VAR", "API_TOKEN"),         # the name of another variable
    ("MAX_TOKENS", "256"),
    ("HF_TOKEN_PATH", "/home/u/.cache/huggingface/token"),
    ("USE_SECRETS", "true"),
    ("TOKEN_URL", "https://auth.example/token"),
    ("TOKENIZERS_PARALLELISM", "false"),   # not a secret word at all
    ("MODEL", "Qwen/Qwen2-VL-72B-Instruct-GPTQ-Int4"),
    ("REVISION", "a1b2c3d4e5f6a7b8c9d0a1b2c3d4e5f6a7b8c9d0"),  # a commit hash (hex)
    ("CUDA_VISIBLE_DEVICES", "0,1"),
])
def test_harmless_settings_are_not_secrets(name: str, value: str) -> None:
    assert literal_secret(name, value) is None


@pytest.mark.parametrize("name, value, rule", [
    ("HF_TOKEN", "hf_abc", "the name has 'TOKEN' and the value is not a number"),
    ("DB_PASSWORD", "hunter2", "the name has 'PASSWORD'"),
    ("OPENAI_API_KEY", "abc", "the name has 'API_KEY'"),
    ("TOKEN_URL", "https://user:pw@auth.example/", "the name has 'TOKEN'"),
    ("FOO", HF, "the value starts with 'hf_' like a Hugging Face token"),
    ("FOO", SK, "the value starts with 'sk-' like an OpenAI key"),
    ("FOO", "ghp_" + "a" * 30, "the value starts with 'ghp_' like a GitHub token"),
    ("FOO", "github_pat_" + "a" * 30, "'github_pat_' like a GitHub token"),
    ("FOO", "glpat-" + "a" * 20, "'glpat-' like a GitLab token"),
    ("FOO", "xoxb-" + "1" * 12, "'xoxb-' like a Slack token"),
    ("FOO", "AKIA" + "ABCDEFGHIJKLMNOP", "'AKIA' like an AWS access key id"),
    ("FOO", JWT, "'eyJ' like a JSON Web Token"),
    ("FOO", PEM, "like a PEM private key"),
    ("FOO", "Bearer abcdefgh12", "the value starts with 'Bearer' like an HTTP credential"),
    ("FOO", RANDOM, "the value is a long random token"),
    ("FOO", f"--token-file={RANDOM}", "the value contains a long random token"),
])
def test_literal_secrets_name_the_rule(name: str, value: str, rule: str) -> None:
    found = literal_secret(name, value)
    assert found is not None and rule in found, found


def test_credential_is_judged_by_value_alone() -> None:
    assert credential("/models/hf_cache/x") is None  # hf_ needs a token's length
    assert credential("task-" + "a" * 20) is None  # "sk-" inside a word is not a key
    assert credential("x " + SK) == "contains 'sk-' like an OpenAI key"


def test_harmless_settings_pass_plan_validation(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["env"] = {"HO_TOKEN_LATENCY": "0.05", "X_SECRET_VAR": "API_TOKEN"}
    run = load_model(write_json(tmp_path, data), RunConfig)
    assert run.deployments[0].env == {"HO_TOKEN_LATENCY": "0.05", "X_SECRET_VAR": "API_TOKEN"}


# ----------------------------------------------------------------------------- redaction

MESSAGES = [  # words of messages (and harmless values): left as they are
    "client.max_token: unknown field (did you mean max_tokens?)",
    "env.HF_TOKEN: looks like a literal secret (value not shown); write { secret = \"NAME\" } "
    "and list NAME in the profile's secrets",
    "extra_args[0]: --api-key is set by synthbatch for engine 'vllm'; remove it",
    "[3]: '--token' takes a secret; pass it through an env secret reference",
    "token: expired; password: wrong",
    "HTTP 401: Basic authentication required; Bearer tokens expire",
    "max_tokens=5 temperature=0.7 HO_TOKEN_LATENCY=0.05 X_SECRET_VAR=API_TOKEN",
    "sbatch: error: Batch job submission failed: Invalid account",
    "see /work/runs/obs-20240101-000000-abcdef/shards/shard-00001/attempts/attempt-0001",
]


@pytest.mark.parametrize("message", MESSAGES)
def test_redaction_never_replaces_words_of_a_message(message: str) -> None:
    assert redact_text(message, "***") == message
    assert one_line(message) == message
    assert redact(message, "x", "HF_TOKEN") == message


@pytest.mark.parametrize("text, expected", [
    (f"vllm serve m --api-key {SK}", "vllm serve m --api-key ***"),
    ("vllm serve m --api-key hunter2", "vllm serve m --api-key ***"),
    ("--token=abc123 --password=x", "--token=*** --password=***"),
    ("HF_TOKEN=hf_abc next", "HF_TOKEN=*** next"),
    ("password=hunter2", "password=***"),
    ('{"api_key": "hunter2", "max_tokens": 5}', '{"api_key": "***", "max_tokens": 5}'),
    ("Authorization: Bearer abcdefghij.kl", "Authorization: Bearer ***"),
    ("authorization: basic dXNlcjpwYXNzd29yZA==", "authorization: basic ***"),
    ("curl http://user:pw@host:8000/x", "curl http://***@host:8000/x"),
    (f"loading token {HF} from cache", "loading token *** from cache"),
    (f"key {RANDOM}.", "key ***."),
    (f"jwt {JWT}", "jwt ***"),
])
def test_redaction_replaces_secret_values(text: str, expected: str) -> None:
    assert redact_text(text, "***") == expected
    assert one_line(text) == expected


def test_redact_hides_a_rejected_value_that_is_a_secret() -> None:
    assert redact("DB_PASSWORD: 'hunter2' is not valid", "hunter2", "DB_PASSWORD") == \
        "DB_PASSWORD: <redacted> is not valid"
    assert redact(f"FOO: {HF!r} or {HF}", HF, "FOO") == "FOO: <redacted> or <redacted>"
    # a plain word is only hidden in its quoted form, never as a word of the sentence
    assert redact("X_PASSWORD: 'is' is not valid", "is", "X_PASSWORD") == \
        "X_PASSWORD: <redacted> is not valid"
    assert redact("HO_TOKEN_LATENCY: '0.05' too high", "0.05", "HO_TOKEN_LATENCY") == \
        "HO_TOKEN_LATENCY: '0.05' too high"
