"""``synthbatch preview``: a few records of a run's recipe, generated here and now.

The run is planned as for ``submit`` (so a bad run file or seed file fails the same way);
the plan is written to a temporary folder and the real agent bundle runs its generator on
it (``python -I agent.pyz generate --plan PLAN --preview N``), so the records are made by
exactly the code a shard runs, without importing it here. Endpoints are the user's own
(``--endpoint ALIAS=URL``, any OpenAI-compatible base URL); LLM columns of an alias without
one are left out, and with none at all only samplers, seed data and expressions run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from synthbatch.agent_stdlib.clientenv import ClientEnv
from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.config.workspace import PROFILE_ENV, default_profile_path
from synthbatch.control.errors import InvalidInput, SynthbatchError
from synthbatch.control.runs.plan import resolve

PREVIEW_ID = "preview-00000000-000000-000000"
STANDIN_WORKSPACE = Path("~/.cache/synthbatch/preview")
MAX_GPUS_PER_NODE = 64  # the profile's own bound: any run's replica fits


class PreviewFailed(SynthbatchError):
    """The generator stopped; the message is its last line."""

    exit_code = 1


def _pairs(items: Sequence[str], flag: str, expected: str,
           valid: Callable[[str], bool]) -> Dict[str, str]:
    """``ALIAS=VALUE`` items as a mapping; InvalidInput naming the bad or repeated one."""
    pairs: Dict[str, str] = {}
    for item in items:
        alias, sep, value = item.partition("=")
        if not sep or not alias or not valid(value):
            raise InvalidInput(f"{flag} {item!r}: expected {expected}")
        if alias in pairs:
            raise InvalidInput(f"{flag} {alias}: given twice")
        pairs[alias] = value
    return pairs


def _web(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def parse_endpoints(items: Sequence[str]) -> Dict[str, str]:
    """``ALIAS=URL`` items as a mapping; InvalidInput naming the bad one."""
    urls = _pairs(items, "--endpoint", "ALIAS=http[s]://host[:port][/prefix]", _web)
    bases = {alias: url.rstrip("/") for alias, url in urls.items()}
    # the generator adds /v1/chat/completions: a base URL written the OpenAI way works too
    return {alias: base[:-3] if base.endswith("/v1") else base for alias, base in bases.items()}


def parse_models(items: Sequence[str]) -> Dict[str, str]:
    """``ALIAS=NAME`` items (the model name an endpoint serves) as a mapping."""
    names = _pairs(items, "--model", "ALIAS=NAME (the model name the endpoint serves)",
                   lambda name: bool(name.strip()))
    return {alias: name.strip() for alias, name in names.items()}


def _check_aliases(flag: str, given: Iterable[str], plan: Plan, run_file: Path) -> None:
    """InvalidInput for the first of ``given`` that is no deployment alias of the plan."""
    aliases = [d.alias for d in plan.deployments]
    for alias in given:
        if alias not in aliases:
            raise InvalidInput(f"{flag} {alias}: not a deployment alias of {run_file} "
                               f"(have: {', '.join(aliases)})")


def served_as(plan: Plan, models: Mapping[str, str], run_file: Path) -> Plan:
    """``plan`` with each ``--model`` alias's served name replaced."""
    _check_aliases("--model", models, plan, run_file)
    return replace(plan, deployments=tuple(
        replace(d, served_name=models.get(d.alias, d.served_name)) for d in plan.deployments))


def _environment(endpoints: Mapping[str, str], scratch: Path,
                 api_key_env: Optional[str]) -> Dict[str, str]:
    if api_key_env and not os.environ.get(api_key_env):
        raise InvalidInput(f"--api-key-env {api_key_env}: that variable is not set")
    contract = ClientEnv(endpoints=dict(endpoints),
                         api_key=os.environ[api_key_env] if api_key_env else None)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
            "SHIV_ROOT": str(scratch / "shiv"), **contract.to_environ()}


def run_preview(run_file: Path, profile: Optional[str], count: int,
                endpoints: Mapping[str, str], agent_pyz: Path,
                api_key_env: Optional[str] = None, timeout_s: float = 600.0,
                models: Optional[Mapping[str, str]] = None,
                on_record: Optional[Callable[[Dict[str, Any]], None]] = None
                ) -> Dict[str, Any]:
    """The first ``count`` records of ``run_file`` as plain data (what ``--json`` prints),
    with the seconds to the first record; ``on_record`` sees each record as it comes."""
    if count < 1:
        raise InvalidInput(f"-n {count}: preview at least one record")
    resolved = resolve(run_file, profile, run_id=PREVIEW_ID)
    plan = resolved.plan
    if plan.client is None:
        raise InvalidInput(f"{run_file}: preview runs the built-in generator; this run's "
                           f"client is a command")
    _check_aliases("--endpoint", endpoints, plan, run_file)
    with tempfile.TemporaryDirectory(prefix="synthbatch-preview-") as tmp:
        scratch = Path(tmp)
        plan_json = RunLayout(scratch).plan_json
        plan_json.write_bytes(served_as(plan, models, run_file).to_json().encode("utf-8")
                              if models else resolved.plan_bytes)
        argv = [sys.executable, "-I", str(agent_pyz), "generate", "--plan", str(plan_json),
                "--preview", str(count)]
        env = _environment(endpoints, scratch, api_key_env)
        records, first_s, status, timed_out, log = _stream(argv, env, scratch, timeout_s,
                                                          on_record)
    if timed_out:
        raise PreviewFailed(f"preview: no result within {timeout_s:g} s")
    if status != 0:
        last = next((line for line in reversed(log) if line.strip()), "")
        raise PreviewFailed(f"preview: the generator exited with status {status}"
                            + (f": {last}" if last else ""))
    return {"run_file": str(run_file), "records": records,
            "endpoints": dict(endpoints), "log": log,
            "first_record_s": None if first_s is None else round(first_s, 3)}


def _stream(argv: List[str], env: Dict[str, str], scratch: Path, timeout_s: float,
            on_record: Optional[Callable[[Dict[str, Any]], None]]
            ) -> Tuple[List[Any], Optional[float], int, bool, List[str]]:
    """Run the generator, handing each record line to ``on_record`` as it arrives:
    (records, seconds to the first, exit status, whether it timed out, its stderr lines)."""
    started = time.monotonic()
    first_s: Optional[float] = None
    records: List[Any] = []
    with open(scratch / "stderr", "w+b") as errors:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=errors)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()
        timer = threading.Timer(timeout_s, expire)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not line.strip():
                    continue
                record = json.loads(line)
                if first_s is None:
                    first_s = time.monotonic() - started
                records.append(record)
                if on_record is not None:
                    on_record(record)
            status = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errors.seek(0)
        log = errors.read().decode("utf-8", "replace").splitlines()
    return records, first_s, status, expired.is_set(), log


def profile_given(profile: Optional[str]) -> bool:
    """True when ``--profile``, ``$SYNTHBATCH_PROFILE`` or the default profile exists."""
    return bool(profile or os.environ.get(PROFILE_ENV)
                or default_profile_path().is_file())


def write_standin(folder: Path) -> Path:
    """The profile preview plans with when the user has none, written into ``folder``; its
    path. Preview submits nothing and starts no server, so what a profile pins down for a
    cluster (partition, accounts, the GPUs of a node) does not matter to it; the run file
    is still planned in full, so a bad run file fails as it would at submit. The stand-in's
    workspace is ``~/.cache/synthbatch/preview`` (only the agent bundle's build cache goes
    there)."""
    workspace = STANDIN_WORKSPACE.expanduser()
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = ["schema_version = 1", 'backend = "slurm"', 'partition = "preview"',
             f"workspace = {json.dumps(str(workspace))}",
             f"python = {json.dumps(sys.executable)}",
             f"gpus_per_node = {MAX_GPUS_PER_NODE}"]
    path = folder / "preview-profile.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
