"""Built-in generation client: a prompt template over record indices -> chat completions.

Reads the client contract from the environment (``SYNTHBATCH_ENDPOINTS``,
``SYNTHBATCH_RECORD_OFFSET``, ``SYNTHBATCH_NUM_RECORDS``, ``SYNTHBATCH_OUTPUT_DIR``,
``SYNTHBATCH_PROGRESS_FILE``, ``SYNTHBATCH_RESUME_DIR``) and the generation spec from the
verified plan. Writes one JSONL file into the output directory, records in index order, and
progress about once a second. Retries 429/503 and connection errors with back-off,
honouring Retry-After.

SIGUSR1/SIGTERM/SIGINT stop generation gracefully: the records written so far (all
complete lines, in index order) are fsynced and kept, and the process exits with
``EXIT_PARTIAL``. A later execution of the same attempt resumes after the last complete
record of the file. A retry (a new attempt) given ``SYNTHBATCH_RESUME_DIR`` copies the
records an earlier attempt completed from there (``agent_stdlib/resume.py``, by record
index) instead of requesting them again; its output still holds the shard's full range.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from agent_stdlib.contracts import GenerateSpec, Plan, ProgressRecord
from agent_stdlib.errors import AgentError
from agent_stdlib.resume import KeptRecords, completion_tokens, parse_record, scan_kept
from agent_stdlib.statefile import read_json, write_json_atomic

RETRYABLE = (429, 500, 502, 503, 504)
EXIT_PARTIAL = 75  # stopped by a signal; the records written so far are complete and kept


class GenerateError(AgentError):
    """A record could not be generated; the message says which and why."""


@dataclass(frozen=True)
class Target:
    """Where requests go and under which model name."""

    base_url: str
    served_name: str


def render_prompt(template: str, index: int) -> str:
    """The prompt of record ``index`` (the template's only field is ``{index}``)."""
    return template.format(index=index)


def request_body(spec: GenerateSpec, served_name: str, prompt: str) -> Dict[str, Any]:
    """The chat-completions request for one record."""
    messages = []
    if spec.system_prompt:
        messages.append({"role": "system", "content": spec.system_prompt})
    messages.append({"role": "user", "content": prompt})
    return {
        "model": served_name,
        "messages": messages,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
    }


def _post(target: Target, body: Dict[str, Any],
          timeout_s: float) -> Tuple[int, Dict[str, str], bytes]:
    parts = urlsplit(target.base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=timeout_s)
    try:
        payload = json.dumps(body).encode("utf-8")
        path = parts.path.rstrip("/") + "/v1/chat/completions"
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _retry_delay(headers: Dict[str, str], attempt: int) -> float:
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value:
        try:
            return min(30.0, max(0.0, float(value)))
        except ValueError:
            pass
    return min(10.0, 0.2 * (2 ** attempt))


def complete(spec: GenerateSpec, target: Target, index: int) -> Dict[str, Any]:
    """Generate record ``index``; retry transient failures up to ``spec.max_retries``."""
    prompt = render_prompt(spec.prompt_template, index)
    body = request_body(spec, target.served_name, prompt)
    last = ""
    for attempt in range(spec.max_retries + 1):
        try:
            status, headers, raw = _post(target, body, spec.request_timeout_s)
        except (OSError, http.client.HTTPException) as err:
            status, headers, raw, last = 0, {}, b"", f"connection error: {err}"
        if status == 200:
            data = json.loads(raw.decode("utf-8"))
            choice = data["choices"][0]
            return {
                "index": index,
                "prompt": prompt,
                "completion": choice["message"]["content"],
                "finish_reason": choice.get("finish_reason"),
                "model": spec.model,
                "served_model": target.served_name,
                "usage": data.get("usage", {}),
            }
        if status:
            last = f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
        if status and status not in RETRYABLE:
            break
        if attempt < spec.max_retries:
            time.sleep(_retry_delay(headers, attempt))
    raise GenerateError(f"record {index}: {last}")


class Progress:
    """Counts finished records and tokens; writes ``progress.json`` at most once a second."""

    def __init__(self, path: Optional[Path], total: int) -> None:
        self.path, self.total = path, total
        self.done = self.tokens = 0
        self.started = time.monotonic()
        self._last_write = 0.0
        self._lock = threading.Lock()

    def add(self, record: Dict[str, Any]) -> None:
        """Count one finished record."""
        with self._lock:
            self.done += 1
            self.tokens += completion_tokens(record)
            if time.monotonic() - self._last_write >= 1.0:
                self.write()

    def skip(self, count: int, tokens: int) -> None:
        """Count ``count`` records (``tokens`` completion tokens) kept, not generated."""
        with self._lock:
            self.done += count
            self.tokens += tokens

    def write(self) -> None:
        """Publish the counters now."""
        if self.path is None:
            return
        elapsed = max(1e-6, time.monotonic() - self.started)
        record = ProgressRecord(records_done=self.done, records_total=self.total,
                                tokens=self.tokens, requests_per_s=self.done / elapsed,
                                updated_at=time.time())
        write_json_atomic(self.path, record.to_dict())
        self._last_write = time.monotonic()


def resume_count(out_file: Path) -> Tuple[int, int]:
    """Complete records already in ``out_file`` and their completion tokens; a torn last
    line is cut off. Reads line by line (the file is not held in memory)."""
    if not out_file.exists():
        return 0, 0
    count = tokens = keep = 0
    with open(out_file, "rb+") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break
            record = parse_record(line)
            count, keep = count + 1, keep + len(line)
            tokens += completion_tokens(record) if record is not None else 0
        if keep != os.fstat(handle.fileno()).st_size:
            handle.truncate(keep)
    return count, tokens


def _result(future: Future, stop: threading.Event) -> Optional[Dict[str, Any]]:
    while True:
        try:
            return future.result(timeout=0.1)
        except FutureTimeout:
            if stop.is_set():
                return None


def generate(spec: GenerateSpec, target: Target, offset: int, count: int, out_file: Path,
             progress: Progress, stop: Optional[threading.Event] = None,
             kept: Optional[KeptRecords] = None) -> int:
    """Generate records ``offset .. offset+count-1`` into ``out_file`` in index order.

    Records already in ``out_file`` (a stopped earlier execution) are kept and skipped;
    records in ``kept`` (an earlier attempt's output) are copied, not requested. Both
    count in ``progress`` with their completion tokens.
    Returns the number of records in the file: ``count`` unless ``stop`` was set.
    """
    stop = stop or threading.Event()
    kept = kept if kept is not None else KeptRecords()
    done, tokens = resume_count(out_file)
    progress.done, progress.tokens = done, tokens
    end = offset + count
    todo = iter(kept.missing(range(offset + done, end)))
    pool = ThreadPoolExecutor(max_workers=spec.concurrency)
    pending: Dict[int, Future] = {}
    handles: Dict[int, BinaryIO] = {}
    try:
        with open(out_file, "ab") as out:
            for index in todo:
                pending[index] = pool.submit(complete, spec, target, index)
                if len(pending) >= spec.concurrency * 2:
                    break
            index = offset + done
            while index < end:
                copied = kept.copy_run(index, end, out, handles)
                if copied:
                    progress.skip(copied, kept.tokens(index, index + copied))
                    index, done = index + copied, done + copied
                    continue
                record = _result(pending.pop(index), stop)
                if record is None:
                    break
                out.write((json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
                index, done = index + 1, done + 1
                progress.add(record)
                nxt = next(todo, None)
                if nxt is not None:
                    pending[nxt] = pool.submit(complete, spec, target, nxt)
            out.flush()
            os.fsync(out.fileno())
    finally:
        pool.shutdown(wait=not stop.is_set(), cancel_futures=True)
        for handle in handles.values():
            handle.close()
    progress.write()
    return done


def kept_records(resume_dir: Optional[str], output: Path, offset: int,
                 count: int) -> KeptRecords:
    """What ``SYNTHBATCH_RESUME_DIR`` already holds (nothing when unset or ``output``)."""
    if not resume_dir:
        return KeptRecords()
    folder = Path(resume_dir)
    if folder.resolve() == output.resolve():
        return KeptRecords()
    kept = scan_kept(folder, offset, count)
    print(f"generate: resuming from {folder}: {len(kept)} of {count} records kept there"
          + (f" ({kept.skipped} unusable line(s) ignored)" if kept.skipped else ""),
          file=sys.stderr, flush=True)
    return kept


def stop_on_signals() -> threading.Event:
    """An event set by SIGUSR1/SIGTERM/SIGINT: finish the current record, keep the rest."""
    stop = threading.Event()
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    return stop


def _target_from_env(plan: Plan, spec: GenerateSpec) -> Target:
    endpoints = json.loads(os.environ["SYNTHBATCH_ENDPOINTS"])
    if spec.model not in endpoints:
        raise GenerateError(f"SYNTHBATCH_ENDPOINTS has no endpoint for model {spec.model!r}")
    return Target(endpoints[spec.model], plan.deployment(spec.model).served_name)


def main(argv: List[str]) -> int:
    """``python agent.pyz generate --plan PLAN``: run the built-in client for one shard."""
    parser = argparse.ArgumentParser(prog="agent generate")
    parser.add_argument("--plan", required=True, type=Path)
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    # which interpreter runs the client (the host's, or an image's: docs/containers.md)
    print(f"generate: python {platform.python_version()} ({sys.executable})", file=sys.stderr,
          flush=True)
    data = read_json(args.plan)
    if data is None:
        print(f"generate: {args.plan}: missing", file=sys.stderr)
        return 2
    plan = Plan.from_dict(data)
    try:
        target = _target_from_env(plan, plan.client)
        offset = int(os.environ["SYNTHBATCH_RECORD_OFFSET"])
        count = int(os.environ["SYNTHBATCH_NUM_RECORDS"])
        output = Path(os.environ["SYNTHBATCH_OUTPUT_DIR"])
        progress_env = os.environ.get("SYNTHBATCH_PROGRESS_FILE")
        progress = Progress(Path(progress_env) if progress_env else None, count)
        out_file = output / f"records-{offset:012d}.jsonl"
        kept = kept_records(os.environ.get("SYNTHBATCH_RESUME_DIR"), output, offset, count)
        written = generate(plan.client, target, offset, count, out_file, progress, stop, kept)
    except (GenerateError, KeyError, ValueError, OSError) as err:
        print(f"generate: {err}", file=sys.stderr)
        return 1
    if written < count:
        print(f"generate: stopped by a signal; kept {written} of {count} records in "
              f"{out_file}", file=sys.stderr, flush=True)
        os._exit(EXIT_PARTIAL)  # in-flight requests are abandoned, not awaited
    print(f"generate: wrote {count} records to {out_file}", file=sys.stderr)
    return 0
