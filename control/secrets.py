"""Recognising literal secrets, so that they are never written into a plan nor echoed.

A value is judged by what it *is* and by the name it is stored under:

- a value that looks like a credential is a secret whatever its name: a well-known token
  prefix (``sk-``, ``hf_``, ``ghp_``, ``AKIA`` ...), a JWT, a PEM private key, an HTTP
  ``Bearer``/``Basic`` credential, or a long random-looking token (:func:`random_token`);
- a name that says it holds a secret (``HF_TOKEN``, ``api_key``) makes any value a secret
  unless the value is plainly not one: a number, a boolean, a path, a URL without
  credentials or the name of another variable (``HO_TOKEN_LATENCY = "0.05"``,
  ``X_SECRET_VAR = "API_TOKEN"`` are settings, ``DB_PASSWORD = "hunter2"`` is a secret).

Every verdict says which rule fired. ``control.errors.redact`` uses the same rules to
replace secret *values* in messages, never words of the message.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable, Optional, Pattern, Tuple

from synthbatch.agent_stdlib.text import quoted

SECRET_WORDS = frozenset({"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD",
                          "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
SECRET_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"),
                          ("SECRET", "KEY")})
HTTP = "an HTTP credential"
RANDOM = "a long random token"
# (what it looks like, pattern); ``prefix`` is the part a message may quote.
CREDENTIALS: Tuple[Tuple[str, Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern)) for kind, pattern in (
        ("an OpenAI key", r"(?<![A-Za-z0-9])(?P<prefix>sk-)[A-Za-z0-9_-]{16,}"),
        ("a Hugging Face token", r"(?<![A-Za-z0-9])(?P<prefix>hf_)[A-Za-z0-9]{20,}"),
        ("a GitHub token", r"(?<![A-Za-z0-9])(?P<prefix>gh[pousr]_)[A-Za-z0-9]{20,}"),
        ("a GitHub token", r"(?<![A-Za-z0-9])(?P<prefix>github_pat_)[A-Za-z0-9_]{20,}"),
        ("a GitLab token", r"(?<![A-Za-z0-9])(?P<prefix>glpat-)[A-Za-z0-9_-]{20,}"),
        ("a Slack token", r"(?<![A-Za-z0-9])(?P<prefix>xox[abprs]-)[A-Za-z0-9-]{10,}"),
        ("an AWS access key id", r"(?<![A-Za-z0-9])(?P<prefix>AKIA)[0-9A-Z]{16}"),
        ("a JSON Web Token", r"(?<![A-Za-z0-9_-])(?P<prefix>eyJ)[A-Za-z0-9_-]{10,}"
                             r"\.eyJ[A-Za-z0-9_-]{10,}"
                             r"(?:\.[A-Za-z0-9_-]*)?"),
        ("a PEM private key", r"(?P<prefix>-----BEGIN [A-Z ]*PRIVATE KEY)-----[^-]*"
                              r"(?:-----END [A-Z ]*PRIVATE KEY-----)?"),
        # only the credential is redacted ("Bearer ***"); a lowercase word is prose
        # ("Basic authentication required")
        (HTTP, r"\b(?P<prefix>(?i:bearer|basic))\s+(?![a-z]+(?![A-Za-z0-9._~+/=-]))"
               r"(?P<secret>[A-Za-z0-9._~+/=-]+)"),
    ))
# A random token: long, in one base64(url) alphabet, with upper and lower case letters and
# digits, few separators and one long unbroken stretch (model names such as
# "Qwen/Qwen2-VL-72B-Instruct-GPTQ-Int4" have many separators and short words) and a high
# character entropy (random base62 of 32 characters has ~4.6 bits per character). It
# catches >= 96% of random 32-character base64url strings, 99% of token_urlsafe(32).
TOKEN_RUN = re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")  # "=": base64 padding
TOKEN_SEPARATOR = re.compile(r"[+/_-]")
TOKEN_MAX_SEPARATORS = 1 / 8  # per character
TOKEN_MIN_STRETCH = 13  # characters without a separator
TOKEN_MIN_ENTROPY = 4.0  # bits per character
# Values a secret-named setting may hold in the clear.
NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
BOOLEAN = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})
VARIABLE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")  # another variable's name: API_TOKEN
PATH = re.compile(r"/[^\s:]*")
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@]*(?:[/?#]\S*)?")
HARMLESS = "a number, boolean, path, URL or variable name"
# Flags whose next argument (or ``=value``) is a credential.
SECRET_FLAGS = ("--api-key", "--api_key", "--apikey", "--token", "--hf-token", "--hf_token",
                "--password", "--secret")
REDACTED = "<redacted>"


def secret_name(name: str) -> Optional[str]:
    """The word of ``name`` that says it holds a secret (``TOKEN`` of ``HF_TOKEN``), if any.

    Whole words only: ``TOKENIZERS_PARALLELISM`` is not a secret name.
    """
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w]
    for word in words:
        if word in SECRET_WORDS:
            return word
    for pair in zip(words, words[1:]):
        if pair in SECRET_PAIRS:
            return "_".join(pair)
    return None


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def random_token(word: str) -> bool:
    """True if ``word`` (one run of token characters) looks like a random credential."""
    if len(word) < 32 or not TOKEN_RUN.fullmatch(word):
        return False
    body = word.rstrip("=")
    if not (re.search(r"[A-Z]", body) and re.search(r"[a-z]", body)
            and re.search(r"[0-9]", body)):
        return False
    stretches = TOKEN_SEPARATOR.split(body)
    if len(stretches) - 1 > len(body) * TOKEN_MAX_SEPARATORS:
        return False
    if max(len(s) for s in stretches) < TOKEN_MIN_STRETCH:
        return False
    return _entropy(body) >= TOKEN_MIN_ENTROPY


def _credentials(text: str) -> Iterable[Tuple[int, int, int, str]]:
    """``(start, secret start, end, rule)`` of every credential-shaped part of ``text``."""
    for kind, pattern in CREDENTIALS:
        for match in pattern.finditer(text):
            secret = match.start("secret") if "secret" in pattern.groupindex else match.start()
            yield match.start(), secret, match.end(), f"{match.group('prefix')!r} like {kind}"
    for match in TOKEN_RUN.finditer(text):
        if random_token(match.group()):
            yield match.start(), match.start(), match.end(), RANDOM


def credential_spans(text: str) -> Iterable[Tuple[int, int]]:
    """``(start, end)`` of every credential in ``text`` (what a redactor replaces)."""
    return ((secret, end) for _, secret, end, _ in _credentials(text))


def credential(value: str) -> Optional[str]:
    """Why ``value`` looks like a credential (``"starts with 'hf_' like a Hugging Face
    token"``), or None."""
    for start, _, end, rule in _credentials(value):
        if rule == RANDOM:
            return f"is {rule}" if (start, end) == (0, len(value)) else f"contains {rule}"
        return f"starts with {rule}" if start == 0 else f"contains {rule}"
    return None


def harmless(value: str) -> bool:
    """True if ``value`` is plainly not a credential (see ``HARMLESS``)."""
    text = value.strip()
    return (not text or text.lower() in BOOLEAN or bool(NUMBER.fullmatch(text))
            or bool(VARIABLE.fullmatch(text)) or bool(PATH.fullmatch(text))
            or bool(URL.fullmatch(text)))


def literal_secret(name: str, value: str) -> Optional[str]:
    """Why ``value`` stored under ``name`` is a literal secret, or None (see module doc)."""
    rule = credential(value)
    if rule:
        return f"the value {rule}"
    word = secret_name(name)
    if word and not harmless(value):
        return f"the name has {word!r} and the value is not {HARMLESS}"
    return None


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
            raise ValueError(f"[{index}]: {flag!r} takes a secret; pass it through an env "
                             f"secret reference instead of the command line")
        rule = credential(arg)
        if rule:
            raise ValueError(f"[{index}]: looks like a literal secret: the argument {rule} "
                             f"(value not shown); use an env secret reference")


# Where a message may carry a secret value next to its name: ``--token=VALUE``,
# ``--api-key VALUE`` (not a lowercase word: "--api-key is set by synthbatch" is prose),
# ``HF_TOKEN=VALUE`` (no spaces: ``secret = "NAME"`` in a sentence is prose),
# ``"api_key": "VALUE"``, and URL userinfo. Every pattern starts only where its token
# starts (a lookbehind), so a long run of letters is scanned once, not once per letter:
# redaction stays linear in the length of the text.
FLAG_VALUE = re.compile(r"(?<![A-Za-z0-9_-])(" + "|".join(map(re.escape, SECRET_FLAGS))
                        + r")(=|\s+)([^\s\"',;&]+)", re.I)
ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z_][A-Za-z0-9_.-]*)(=|[\"']\s*:\s*[\"'])"
                        r"([^\s\"',;&]+)")
WORD = re.compile(r"[a-z]+")
USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def redact_text(text: str, marker: str) -> str:
    """``text`` with every secret *value* replaced by ``marker``: credential-shaped parts,
    the values of credential flags, of secret-named assignments (unless plainly not
    secret, as :func:`literal_secret` judges) and URL userinfo. Words of the message
    (``max_token``, ``secret``) are never replaced."""
    spans = sorted(credential_spans(text))
    if spans:
        parts, last = [], 0
        for start, end in spans:
            if start >= last:
                parts += [text[last:start], marker]
                last = end
            else:
                last = max(last, end)
        text = "".join(parts) + text[last:]

    def flag(match: re.Match[str]) -> str:
        name, sep, value = match.groups()
        prose = sep != "=" and WORD.fullmatch(value)
        return match.group(0) if prose or value == marker else name + sep + marker

    def assignment(match: re.Match[str]) -> str:
        name, sep, value = match.groups()
        keep = value == marker or not literal_secret(name, value)
        return match.group(0) if keep else name + sep + marker

    text = ASSIGNMENT.sub(assignment, FLAG_VALUE.sub(flag, text))
    return USERINFO.sub(lambda m: m.group(1) + marker + "@", text)


def redact(message: str, value: object = None, name: str = "") -> str:
    """``message`` redacted (:func:`redact_text`), and without ``value`` when it is a
    literal secret stored under ``name``: its quoted form always, the bare value when it
    is credential-shaped (a plain word is never replaced inside a sentence)."""
    if isinstance(value, str) and value and literal_secret(name, value):
        message = message.replace(repr(value), REDACTED).replace(quoted(value), REDACTED)
        if credential(value):
            message = message.replace(value, REDACTED)
    return redact_text(message, REDACTED)
