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
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from synthbatch.agent_stdlib.clientenv import ClientEnv
from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.errors import InvalidInput, SynthbatchError
from synthbatch.control.runs.plan import resolve

PREVIEW_ID = "preview-00000000-000000-000000"


class PreviewFailed(SynthbatchError):
    """The generator stopped; the message is its last line."""

    exit_code = 1


def parse_endpoints(items: Sequence[str]) -> Dict[str, str]:
    """``ALIAS=URL`` items as a mapping; InvalidInput naming the bad one."""
    endpoints: Dict[str, str] = {}
    for item in items:
        alias, sep, url = item.partition("=")
        parts = urlsplit(url)
        if not sep or not alias or parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(f"--endpoint {item!r}: expected ALIAS=http[s]://host[:port]"
                               f"[/prefix]")
        if alias in endpoints:
            raise InvalidInput(f"--endpoint {alias}: given twice")
        base = url.rstrip("/")
        endpoints[alias] = base[:-3] if base.endswith("/v1") else base  # the generator
        # adds /v1/chat/completions: a base URL written the OpenAI way works too
    return endpoints


def parse_models(items: Sequence[str]) -> Dict[str, str]:
    """``ALIAS=NAME`` items (the model name an endpoint serves) as a mapping."""
    models: Dict[str, str] = {}
    for item in items:
        alias, sep, name = item.partition("=")
        if not sep or not alias or not name.strip():
            raise InvalidInput(f"--model {item!r}: expected ALIAS=NAME (the model name "
                               f"the endpoint serves)")
        if alias in models:
            raise InvalidInput(f"--model {alias}: given twice")
        models[alias] = name.strip()
    return models


def served_as(plan: Plan, models: Mapping[str, str], run_file: Path) -> Plan:
    """``plan`` with each ``--model`` alias's served name replaced."""
    aliases = [d.alias for d in plan.deployments]
    for alias in models:
        if alias not in aliases:
            raise InvalidInput(f"--model {alias}: not a deployment alias of {run_file} "
                               f"(have: {', '.join(aliases)})")
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
    aliases = [d.alias for d in plan.deployments]
    for alias in endpoints:
        if alias not in aliases:
            raise InvalidInput(f"--endpoint {alias}: not a deployment alias of {run_file} "
                               f"(have: {', '.join(aliases)})")
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
