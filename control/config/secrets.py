"""Recognising secrets so that they are never written into a plan nor echoed in a message.

Two signals: a *name* that says it holds a secret (``HF_TOKEN``, ``api_key``), and a
*value* that looks like a well-known credential (``sk-...``, ``hf_...``, a private key).
Messages about such fields never include the value; ``redact`` is the safety net for
every message that leaves the config loader.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

SECRET_WORDS = frozenset({"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD",
                          "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
SECRET_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"),
                          ("SECRET", "KEY")})
SECRET_VALUE = re.compile(
    r"(sk-[A-Za-z0-9_-]{16,}"          # OpenAI-style keys
    r"|hf_[A-Za-z0-9]{20,}"            # Hugging Face tokens
    r"|gh[pousr]_[A-Za-z0-9]{20,}"     # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"       # GitLab tokens
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"   # Slack tokens
    r"|AKIA[0-9A-Z]{16}"               # AWS access key ids
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}"  # JWTs
    r"|-----BEGIN [A-Z ]*PRIVATE KEY"
    r"|Bearer\s+\S{8,})")
# Flags whose next argument (or ``=value``) is a credential.
SECRET_FLAGS = ("--api-key", "--api_key", "--token", "--hf-token", "--password")
REDACTED = "<redacted>"


def secret_name(name: str) -> bool:
    """True if a key or variable name says it holds a secret (``HF_TOKEN``, ``api-key``).

    Whole words only: ``TOKENIZERS_PARALLELISM`` is not a secret.
    """
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w]
    if SECRET_WORDS.intersection(words):
        return True
    return any(pair in SECRET_PAIRS for pair in zip(words, words[1:]))


def secret_value(value: str) -> bool:
    """True if a value looks like a well-known credential."""
    return bool(SECRET_VALUE.search(value))


def secret_flag(arg: str) -> Optional[str]:
    """The credential flag ``arg`` is (``--api-key`` or ``--api-key=...``), if any."""
    for flag in SECRET_FLAGS:
        if arg == flag or arg.startswith(flag + "="):
            return flag
    return None


def check_args(args: Iterable[str]) -> None:
    """Reject literal credentials in an argv; the message names the index, never the value."""
    for index, arg in enumerate(args):
        flag = secret_flag(arg)
        if flag:
            raise ValueError(f"[{index}]: {flag} takes a secret; pass it through an env "
                             f"secret reference instead of the command line")
        if secret_value(arg):
            raise ValueError(f"[{index}]: looks like a literal secret (value not shown); "
                             f"use an env secret reference")


def redact(message: str, value: object = None, sensitive: bool = False) -> str:
    """``message`` without credential-like text, and without ``value`` if ``sensitive``."""
    if isinstance(value, str) and value and (sensitive or secret_value(value)):
        message = message.replace(repr(value), REDACTED).replace(value, REDACTED)
    return SECRET_VALUE.sub(REDACTED, message)
