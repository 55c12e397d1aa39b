"""One record through the recipe: seed row, samplers and expressions, then LLM cells as
soon as what they use is there (independent LLM columns of a record run at once).

An LLM cell is retried up to ``max_retries`` times on a 5xx, a connection error, a timeout
or an answer that is not what the column asked for (with full-jitter exponential
back-off). A 429 or 503 is backpressure: the alias's limiter slows down, the request
waits ``Retry-After`` and goes again, and it never uses up a retry. Any other 4xx is final.
A cell that still fails is the record's failure, which ``on_error`` decides: ``fail``
stops the shard, ``drop`` leaves the record out (listed as dropped), ``keep`` writes it
with ``"_error"`` and ``null`` for the failed column and every column that uses it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple, Union

from ..errors import AgentError
from ..recipe.kinds import VALIDATION, default
from ..recipe.reuse import canonical_json, request_digest
from ..recipe.template import render
from .cachestats import cached_tokens
from .concurrency import Limiter
from .http import Endpoint, HttpError, Reply
from .llm import InvalidOutput, parse_answer, request_body
from .logic import LogicError, compute, draw, skipped
from .order import DispatchOrder
from .output import record_bytes
from .progress import AliasCounters
from .recipe import LEGACY_COLUMN, Column, Recipe
from .retrying import RETRIED_KINDS, retry_body
from .reuse import Cells
from .samplers import cell_bits
from .seeds import SeedRows
from .validators import check

CHAT = "/v1/chat/completions"
RESERVED = ("index", "_meta", "_error")  # record keys of the generator's own
BACKPRESSURE = (429, 503)
RETRYABLE = (408, 500, 502, 504)
BACKOFF_BASE_S, BACKOFF_CAP_S, RETRY_AFTER_CAP_S = 0.5, 30.0, 60.0
_jitter = random.Random()  # back-off only: never a record's value


class GenerateError(AgentError):
    """The shard cannot go on; the message names the record and column."""


class CellFailure(Exception):
    """An LLM cell that failed for good."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column, self.message = column, message


@dataclass
class Alias:
    """Everything a request to one alias needs."""

    endpoint: Endpoint
    limiter: Limiter
    counters: AliasCounters


@dataclass
class Open:
    """What the LLM cells of one record share: its affinity key, its rank in the dispatch
    order, and the conversations other columns continue (messages and answer)."""

    key: Optional[str]  # None until the first LLM cell; "" for no affinity
    rank: int
    conversations: Dict[str, List[Dict[str, str]]]


class Started(NamedTuple):
    """A record begun: its seed row, values and cells so far, and the columns filled."""

    row: Dict[str, Any]
    values: Dict[str, Any]
    meta: Dict[str, Dict[str, Any]]
    rec: Open
    filled: Set[str]


def affinity(recipe: Recipe, index: int, values: Dict[str, Any]) -> str:
    """A record's affinity key: records whose recipe-level context differs by record share
    a key when their context is the same text (the same seed document); otherwise one key
    per record, or none ("": today's routing) when a record makes a single request (it
    shares nothing with itself). A context that is the same for every record needs no
    shared key (every replica caches it once)."""
    if recipe.context is not None and recipe.context_inputs:
        text = render(recipe.context, values.get)
        return "ctx-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
    if sum(c.llm for c in recipe.order) < 2:
        return ""
    return f"rec-{index}"


@dataclass
class Outcome:
    """A settled record: its line (a record, or a dropped-record line), and its tokens."""

    index: int
    line: bytes
    dropped: bool = False
    tokens: int = 0
    cells: Tuple[int, int] = (0, 0)  # LLM cells (reused, generated) of the record (issue 31)


def retry_after(reply: Reply) -> Optional[float]:
    """``Retry-After`` in seconds (capped), or None when absent or not a number."""
    try:
        return min(RETRY_AFTER_CAP_S, max(0.0, float(reply.headers["retry-after"])))
    except (KeyError, ValueError):
        return None


def backoff(attempt: int) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^attempt))."""
    return _jitter.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** attempt))


class Engine:
    """Builds records (see the module docstring)."""

    def __init__(self, recipe: Recipe, seed: int, on_error: str, max_retries: int,
                 timeout_s: float, aliases: Dict[str, Alias],
                 seeds: Optional[SeedRows] = None, reuse: Optional[Cells] = None,
                 identities: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
        self.recipe, self.seed, self.on_error = recipe, seed, on_error
        self.reuse = reuse  # cells of reused runs (issue 31), None: generate every cell
        self.identities = identities or {}  # alias -> model identity (recipe.reuse)
        self._models: Dict[str, Tuple[Dict[str, Any], bytes]] = {}  # and its JSON, once
        self.max_retries, self.timeout_s = max_retries, timeout_s
        self.aliases, self.seeds = aliases, seeds
        self._names = {c.name for c in recipe.columns}
        self.order = DispatchOrder(1, None)  # index order until the producer sets one
        self.whole_tag: Optional[str] = None  # the seed tag records are taken whole for
        self.llm = [c.name for c in recipe.order if c.llm]  # in evaluation order
        self._tail = [c.name for c in recipe.columns if not c.drop
                      and c.name not in recipe.skipped] + ["_meta"]

    def dispatch_in_blocks(self, width: int) -> None:
        """Rank records sharing a seed row together within blocks of ``width`` indexes."""
        self.order = DispatchOrder(width, self.seeds.number if self.seeds else None)

    # ---- one record -------------------------------------------------------------------

    def _start(self, index: int) -> Started:
        row = self.seeds.row(index) if self.seeds is not None else {}
        for name in RESERVED:
            row.pop(name, None)  # a seed field cannot stand in for the record's own
        values: Dict[str, Any] = dict(row)
        values["index"] = index
        return Started(row, values, {}, Open(None, self.order.rank(index), {}), set())

    def reused(self, index: int) -> Union[Outcome, Started]:
        """Record ``index`` built at once when every LLM cell of it is in the reused runs
        (issue 31: no task, no wait); else what was filled in column order up to the first
        cell to generate, for :meth:`record` to go on from."""
        assert self.reuse is not None
        if self.whole_tag is not None:  # the record copied, proven the same (wholereuse)
            line = self.reuse.whole(index, self.whole_tag, self.llm, self._tail)
            if line is not None:
                return Outcome(index, line, cells=(len(self.llm), 0))
        start = self._start(index)
        row, values, meta, rec, filled = start
        for column in self.recipe.order:
            if column.kind == VALIDATION or column.name in self.recipe.continued:
                return start  # a checker to run, or raw text not kept: the task's way
            try:
                if skipped(column.name, column.logic, values):
                    values[column.name] = None  # as ``_columns``: no request, no cell
                elif not column.llm:
                    values[column.name] = self._local(column, index, values)
                else:
                    body = self._body(column, values, rec)
                    kept = self.reuse.take(index, column.name, self._digest(column, body))
                    if kept is None:
                        return start
                    values[column.name], meta[column.name] = kept
            except (LogicError, ValueError, TypeError, KeyError):
                return self._start(index)  # the task's way says which cell failed and how
            filled.add(column.name)
        return self._outcome(index, row, values, meta, None)

    def whole_lines(self, first: int, stop: int) -> List[bytes]:
        """The lines of records ``first, first+1, ...`` (up to ``stop``) taken whole from
        the reused runs, up to the first that is not (``wholereuse``)."""
        lines: List[bytes] = []
        if self.reuse is None or self.whole_tag is None:
            return lines
        whole, tag, llm, tail = self.reuse.whole, self.whole_tag, self.llm, self._tail
        for index in range(first, stop):
            line = whole(index, tag, llm, tail)
            if line is None:
                break
            lines.append(line)
        return lines

    async def record(self, index: int, start: Optional[Started] = None) -> Outcome:
        """Build record ``index`` (from ``start``: :meth:`reused`'s part); GenerateError
        when ``on_error`` is ``fail``."""
        row, values, meta, rec, filled = start or self._start(index)
        failure = await self._columns(index, values, meta, rec, filled)
        if failure is not None and self.on_error == "fail":
            raise GenerateError(f"record {index}: column {failure.column}: {failure.message}")
        if failure is not None and self.on_error == "drop":
            line = json.dumps({"index": index, "column": failure.column,
                               "error": failure.message}, ensure_ascii=False)
            return Outcome(index, line.encode("utf-8") + b"\n", dropped=True)
        return self._outcome(index, row, values, meta, failure)

    async def _columns(self, index: int, values: Dict[str, Any],
                       meta: Dict[str, Dict[str, Any]], rec: Open,
                       filled: Set[str]) -> Optional[CellFailure]:
        """Fill ``values`` column by column (but the ``filled`` ones); the first cell
        failure (the rest that use it stay unset)."""
        todo = [c for c in self.recipe.order if c.name not in filled]
        running: Dict[asyncio.Future, Column] = {}
        failed: List[str] = []
        skips: Set[str] = set()
        failure: Optional[CellFailure] = None
        while todo or running:
            for column in list(todo):
                if any(n in failed for n in column.inputs):
                    todo.remove(column)
                    failed.append(column.name)
                elif all(n in values or n not in self._names for n in column.inputs):
                    todo.remove(column)
                    try:
                        if skipped(column.name, column.logic, values) or (
                                column.params.get("continue_from") in skips):
                            values[column.name] = None  # no request, dependants see null
                            skips.add(column.name)  # a continuation of it is skipped too
                        elif column.llm:
                            if rec.key is None:
                                rec.key = affinity(self.recipe, index, values)
                            running[asyncio.ensure_future(self._cell(column, index, values,
                                                                     rec))] = column
                        elif column.kind == VALIDATION:
                            running[asyncio.ensure_future(self._validate(column, values))] = \
                                column
                        else:
                            values[column.name] = self._local(column, index, values)
                    except (LogicError, ValueError, TypeError, KeyError) as err:
                        failed.append(column.name)
                        failure = failure or (
                            CellFailure(err.column, err.message) if isinstance(err, LogicError)
                            else CellFailure(column.name, f"{err}"))
                        if self.on_error != "keep":
                            for other in running:
                                other.cancel()
                            return failure
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                column = running.pop(future)
                try:
                    values[column.name], cell = future.result()
                    if cell is not None:
                        meta[column.name] = cell
                except CellFailure as err:
                    failed.append(column.name)
                    failure = failure or err
                    if self.on_error != "keep":
                        for other in running:
                            other.cancel()
                        return failure
        return failure

    async def _validate(self, column: Column, values: Dict[str, Any]) -> Tuple[Any, None]:
        """A validation cell, off the event loop (it may run a child process); a
        CellFailure when it is invalid and the column says ``on_invalid = "error"``."""
        loop = asyncio.get_running_loop()
        value = await loop.run_in_executor(None, check, column.params, dict(values))
        if not value["valid"] and column.params.get("on_invalid") == "error":
            raise CellFailure(column.name, "invalid: " + "; ".join(value["errors"]))
        return value, None

    def _local(self, column: Column, index: int, values: Dict[str, Any]) -> Any:
        """A sampler's or an expression's value (LogicError: the cell failed)."""
        if column.sampler is not None:
            return draw(column.name, column.logic, self.seed, index, values)
        return compute(column.name, column.logic, column.templates.get("template"), values)

    def _outcome(self, index: int, row: Dict[str, Any], values: Dict[str, Any],
                 meta: Dict[str, Dict[str, Any]], failure: Optional[CellFailure]) -> Outcome:
        tokens = sum(int(m.get("usage", {}).get("completion_tokens") or 0)
                     for m in meta.values() if "reused_from" not in m)  # generated only
        reused = sum(1 for m in meta.values() if "reused_from" in m)
        cells = (reused, len(meta) - reused)
        if self.recipe.legacy:
            return Outcome(index, self._legacy_line(index, values, meta), tokens=tokens,
                           cells=cells)
        record: Dict[str, Any] = {"index": index}
        record.update(row)
        for column in self.recipe.columns:
            if not column.drop and column.name not in self.recipe.skipped:
                record[column.name] = values.get(column.name)
        record["_meta"] = {"index": index, "columns": meta}
        if failure is not None:
            record["_error"] = {"column": failure.column, "message": failure.message}
        return Outcome(index, record_bytes(record), tokens=tokens, cells=cells)

    def _legacy_line(self, index: int, values: Dict[str, Any],
                     meta: Dict[str, Dict[str, Any]]) -> bytes:
        column = self.recipe.columns[0]
        cell = meta.get(LEGACY_COLUMN, {})
        record = {"index": index, "prompt": render(column.templates["prompt"], values.get),
                  "completion": values.get(LEGACY_COLUMN),
                  "finish_reason": cell.get("finish_reason"), "model": column.alias,
                  "served_model": column.served, "usage": cell.get("usage", {}),
                  "latency_ms": cell.get("latency_ms")}
        return (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")

    # ---- one LLM cell -----------------------------------------------------------------

    def _body(self, column: Column, values: Dict[str, Any], rec: Open) -> Dict[str, Any]:
        """The request of one cell, laid out by :func:`llm.messages`."""
        system, context = column.templates.get("system"), column.templates.get("context")
        source = column.params.get("continue_from")
        recipe_context = self.recipe.context
        shared = [render(context, values.get) if context else ""]
        if source is None and recipe_context is not None:
            shared.insert(0, render(recipe_context, values.get))
        return request_body(column.kind, column.name, column.params, column.served,
                            render(column.templates["prompt"], values.get),
                            render(system, values.get) if system else None, shared,
                            rec.conversations.get(source) if source else None)

    def _digest(self, column: Column, body: Dict[str, Any]) -> str:
        """The cell's request digest (``recipe.reuse``)."""
        model = self._models.get(column.alias)
        if model is None:
            identity = self.identities.get(column.alias, {"served_name": column.served})
            model = self._models[column.alias] = (identity, canonical_json(dict(identity)))
        return request_digest(model[0], body, model[1])

    async def _cell(self, column: Column, index: int, values: Dict[str, Any],
                    rec: Open) -> Tuple[Any, Dict[str, Any]]:
        body = self._body(column, values, rec)
        digest = self._digest(column, body)
        kept = (self.reuse.take(index, column.name, digest)
                if self.reuse and column.name not in self.recipe.continued else None)
        if kept is not None:
            return kept  # a continued column is generated: its raw text is not kept
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        alias = self.aliases[column.alias]
        attempts = 0
        changes: List[Dict[str, Any]] = []
        while True:
            kind, value, wait = await self._attempt(alias, column, rec, payload)
            if kind == "ok":
                answer, meta = value
                if column.name in self.recipe.continued:
                    rec.conversations[column.name] = body["messages"] + [
                        {"role": "assistant", "content": meta["text"]}]
                cell = {"model": column.alias, "served_model": meta["served_model"]
                        or column.served, "finish_reason": meta["finish_reason"],
                        "usage": meta["usage"], "attempts": attempts + 1,
                        "latency_ms": meta["latency_ms"], "request_digest": digest}
                if changes:
                    cell["retries"] = changes
                if "language" in meta:
                    cell["language"] = meta["language"]  # llm-code
                return answer, cell
            alias.counters.errors[kind] += 1
            if kind in ("429", "503"):
                await asyncio.sleep(wait if wait is not None else backoff(1))
                continue  # backpressure: slow down, but it is not a failed attempt
            attempts += 1
            finish = None
            if kind == "invalid_output":
                value, finish = value
            if kind == "4xx" or attempts > self.max_retries:
                raise CellFailure(column.name, f"{value} (attempt {attempts} of "
                                               f"{self.max_retries + 1})")
            change: Dict[str, Any] = {}
            if kind == "invalid_output" and column.kind in RETRIED_KINDS:
                body, change = self._retry_body(column, index, body, attempts, finish)
                payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
            changes.append(dict(change, attempt=attempts + 1, after=kind))
            await asyncio.sleep(backoff(attempts))

    def _retry_body(self, column: Column, index: int, body: Dict[str, Any],
                    attempts: int, finish: Optional[str]
                    ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The next request after an invalid answer (:mod:`retrying`): its seed comes
        from the cell's bits and the attempt, so a rerun retries the same way."""
        bits = cell_bits(self.seed, f"{column.name}\x00retry{attempts}", index)
        seed = int.from_bytes(bits[:4], "big") & 0x7FFFFFFF
        base = int(column.params.get("max_tokens", default(column.kind, "max_tokens")))
        return retry_body(body, base, seed, finish)

    async def _attempt(self, alias: Alias, column: Column, rec: Open,
                       payload: bytes) -> Tuple[str, Any, Optional[float]]:
        """(kind, value, Retry-After): ``ok`` with (value, meta), else an error kind
        (``429``, ``503``, ``5xx``, ``4xx``, ``timeout``, ``connection``,
        ``invalid_output``) with its message."""
        sent_at = await alias.limiter.acquire(rec.rank)
        try:
            reply = await asyncio.wait_for(alias.endpoint.post(CHAT, payload, rec.key or ""),
                                           self.timeout_s)
        except asyncio.TimeoutError:
            alias.limiter.congested(sent_at)
            return "timeout", f"no answer within {self.timeout_s:g} s", None
        except HttpError as err:
            return "connection", str(err), None
        finally:
            alias.limiter.release()
        latency_s = time.monotonic() - sent_at
        latency_ms = round(latency_s * 1000.0, 1)
        if reply.status != 200:
            alias.counters.requests += 1
        if reply.status in BACKPRESSURE:
            alias.limiter.congested(sent_at)
            return str(reply.status), _status_text(reply), retry_after(reply)
        if reply.status != 200:
            kind = "5xx" if reply.status >= 500 or reply.status in RETRYABLE else "4xx"
            return kind, _status_text(reply), None
        alias.limiter.succeeded(sent_at, column.name)
        data: Any = None
        try:
            data = json.loads(reply.body)
            usage = data.get("usage") if isinstance(data, dict) else None
            alias.counters.answered(usage if isinstance(usage, dict) else {},
                                    cached_tokens(data), column.name, latency_s)
            value, meta = parse_answer(column.kind, column.params, data)
        except (ValueError, InvalidOutput) as err:
            return "invalid_output", (f"invalid answer: {err}", finish_reason(data)), None
        meta["latency_ms"] = latency_ms
        return "ok", (value, meta), None


def finish_reason(data: Any) -> Optional[str]:
    """The ``finish_reason`` of a chat-completion answer, if it has one."""
    try:
        reason = data["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


def _status_text(reply: Reply) -> str:
    text = reply.body[:300].decode("utf-8", "replace").replace("\n", " ")
    return f"HTTP {reply.status}: {text}"
