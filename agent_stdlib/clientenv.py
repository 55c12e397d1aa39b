"""The client contract: the ``SYNTHBATCH_*`` variables a client step runs with.

One home for their names, their defaults and how they are read back: the agent writes them
(:func:`agent_stdlib.allocation.launch.client_contract`), the built-in ``generate`` role and
the Data Designer adapter read them (:meth:`ClientEnv.from_environ`), and ``synthbatch
preview`` writes the preview's subset. ``docs/configuration.md`` ("The client contract")
documents them for command clients.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

ENDPOINTS = "SYNTHBATCH_ENDPOINTS"  # JSON alias -> proxy root URL (no /v1)
DEPLOYMENTS = "SYNTHBATCH_DEPLOYMENTS"  # JSON alias -> {"base_url": .../v1, "model": name}
OPENAI_BASE_URL = "SYNTHBATCH_OPENAI_BASE_URL"  # the only deployment's base_url
MODEL = "SYNTHBATCH_MODEL"  # the only deployment's served name
SHARD_INDEX = "SYNTHBATCH_SHARD_INDEX"
SHARD_COUNT = "SYNTHBATCH_SHARD_COUNT"
RECORD_OFFSET = "SYNTHBATCH_RECORD_OFFSET"  # the shard's first record index (default 0)
NUM_RECORDS = "SYNTHBATCH_NUM_RECORDS"
OUTPUT_DIR = "SYNTHBATCH_OUTPUT_DIR"
PROGRESS_FILE = "SYNTHBATCH_PROGRESS_FILE"
RESUME_DIR = "SYNTHBATCH_RESUME_DIR"  # an earlier attempt's output/ to continue from
API_KEY = "SYNTHBATCH_API_KEY"  # sent as a bearer token (preview against an endpoint)

# The variables that hold host paths (translated to the container's view inside one).
PATH_VARS = (OUTPUT_DIR, PROGRESS_FILE, RESUME_DIR)


class ClientEnvError(ValueError):
    """A contract variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class ClientEnv:
    """The client contract as plain data (``None``: the variable is not set)."""

    endpoints: Dict[str, str] = field(default_factory=dict)
    deployments: Dict[str, Dict[str, str]] = field(default_factory=dict)
    shard_index: Optional[int] = None
    shard_count: Optional[int] = None
    record_offset: int = 0
    num_records: Optional[int] = None
    output_dir: Optional[str] = None
    progress_file: Optional[str] = None
    resume_dir: Optional[str] = None
    api_key: Optional[str] = None

    def to_environ(self) -> Dict[str, str]:
        """The variables to put into the client step's environment."""
        env = {ENDPOINTS: json.dumps(dict(self.endpoints), sort_keys=True),
               RECORD_OFFSET: str(self.record_offset)}
        if self.deployments:
            env[DEPLOYMENTS] = json.dumps(self.deployments, sort_keys=True)
        if len(self.deployments) == 1:
            only = next(iter(self.deployments.values()))
            env[OPENAI_BASE_URL] = only["base_url"]
            env[MODEL] = only["model"]
        optional = {SHARD_INDEX: self.shard_index, SHARD_COUNT: self.shard_count,
                    NUM_RECORDS: self.num_records, OUTPUT_DIR: self.output_dir,
                    PROGRESS_FILE: self.progress_file, RESUME_DIR: self.resume_dir,
                    API_KEY: self.api_key}
        env.update({k: str(v) for k, v in optional.items() if v not in (None, "")})
        return env

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> ClientEnv:
        """Read the contract back; :class:`ClientEnvError` names a malformed variable."""
        return cls(endpoints=_json_object(env, ENDPOINTS),
                   deployments=_json_object(env, DEPLOYMENTS),
                   shard_index=_int(env, SHARD_INDEX, None),
                   shard_count=_int(env, SHARD_COUNT, None),
                   record_offset=_int(env, RECORD_OFFSET, 0),
                   num_records=_int(env, NUM_RECORDS, None),
                   output_dir=env.get(OUTPUT_DIR) or None,
                   progress_file=env.get(PROGRESS_FILE) or None,
                   resume_dir=env.get(RESUME_DIR) or None, api_key=env.get(API_KEY) or None)

    def shard_output(self) -> Tuple[int, str]:
        """(records in the shard, its output folder): what a shard's writer needs;
        :class:`ClientEnvError` names whichever is not set."""
        for name, value in ((NUM_RECORDS, self.num_records), (OUTPUT_DIR, self.output_dir)):
            if value is None:
                raise ClientEnvError(f"{name}: not set (the client contract of a shard)")
        assert self.num_records is not None and self.output_dir is not None
        return self.num_records, self.output_dir


def _int(env: Mapping[str, str], name: str, default: Optional[int]) -> Optional[int]:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ClientEnvError(f"{name}: expected a whole number, got {raw[:40]!r}") from None
    if value < 0:
        raise ClientEnvError(f"{name}: must be >= 0, got {value}")
    return value


def _json_object(env: Mapping[str, str], name: str) -> Dict:
    raw = env.get(name, "")
    if raw == "":
        return {}
    try:
        value = json.loads(raw)
    except ValueError as err:
        raise ClientEnvError(f"{name}: not JSON ({err})") from None
    if not isinstance(value, dict):
        raise ClientEnvError(f"{name}: expected a JSON object")
    return value
