"""The built-in generator (``python agent.pyz generate --plan PLAN``): one shard's records.

Reads the client contract from the environment (``SYNTHBATCH_ENDPOINTS``,
``SYNTHBATCH_RECORD_OFFSET``, ``SYNTHBATCH_NUM_RECORDS``, ``SYNTHBATCH_OUTPUT_DIR``,
``SYNTHBATCH_PROGRESS_FILE``, ``SYNTHBATCH_RESUME_DIR``; ``SYNTHBATCH_API_KEY`` is sent
as a bearer token when set) and the recipe from the verified plan (``docs/generator.md``).

Records flow through the column graph concurrently on one event loop: up to a window of
records are open at once, each waiting for its LLM cells' aliases
(``concurrency.Limiter``, lowest record index first), so record k's answer may be in
flight while record k+1's question is; finished records wait in a reorder buffer and go
out in index order (``output.Output``). Progress is published about once a second and a
log line printed every ~10 s (``progress.Progress``).

SIGUSR1/SIGTERM/SIGINT stop generation gracefully: the records written so far (complete
lines, in index order) are fsynced and kept, and the process exits with
``EXIT_PARTIAL``. A later execution of the same attempt resumes after them
(``Output.resume``). A retry (a new attempt) given ``SYNTHBATCH_RESUME_DIR`` copies the
records an earlier attempt completed (``agent_stdlib/resume.py``) instead of requesting
them again. ``--preview N`` prints the first N records on stdout instead (``synthbatch
preview``): errors are kept in the records, and LLM columns without an endpoint are left
out.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional

from ..clientenv import ENDPOINTS, ClientEnv
from ..contracts import EXIT_CLIENT_CONFIG, ContractError, Plan
from ..layout import RunLayout
from ..recipe.reuse import model_identity
from ..recipe.seeds import SeedError
from ..recipe.sizing import bounds
from ..resume import KeptRecords, scan_kept
from ..statefile import read_json
from ..text import visible
from .cachestats import ProxySampler
from .concurrency import Limiter
from .http import Endpoint
from .output import Output, Resumed
from .progress import AliasCounters, Progress
from .recipe import Recipe, RecipeError, compile_recipe
from .records import Alias, Engine, GenerateError, Outcome
from .reuse import Cells, run_files
from .seeds import SeedRows
from .wholereuse import eligible, provable, seed_tag, write_inputs

ABANDON_AFTER_S = 0.5  # how long a stopped client lets its cancelled requests end
EXIT_PARTIAL = 75  # stopped by a signal; the records written so far are complete and kept
MIN_WINDOW = 64
MAX_WINDOW = 16384
POLL_S = 0.05  # how often the loop looks at the stop event
COPY_LINES = 4096  # records taken whole (issue 31) written and fsynced together


@dataclass
class Shard:
    """The records to make and where they go."""

    offset: int
    count: int
    output: Output
    progress: Progress
    kept: KeptRecords


def limiters(plan: Plan, recipe: Recipe, offset: int = 0) -> Dict[str, Limiter]:
    """One limiter per alias: the fixed concurrency of the shard at ``offset`` (a benchmark
    point) or of the plan, or adaptive bounds."""
    own = [s.concurrency for s in plan.shards if s.record_offset == offset and s.concurrency]
    fixed = own[0] if own else (plan.client.concurrency if plan.client else None)
    out = {}
    for alias in recipe.aliases:
        dep = plan.deployment(alias)
        start, ceiling = bounds(dep.replicas, dep.max_queued_requests)
        out[alias] = Limiter(fixed or start, fixed or ceiling, adaptive=fixed is None)
    return out


def window(limits: Dict[str, Limiter], count: int) -> int:
    """How many records may be open at once: enough to fill every alias at its ceiling
    while earlier records wait for another alias."""
    wanted = 2 * sum(lim.ceiling for lim in limits.values()) + MIN_WINDOW
    return max(1, min(count, MAX_WINDOW, wanted))


class Producer:
    """Runs one shard (see the module docstring)."""

    def __init__(self, engine: Engine, shard: Shard, width: int,
                 stop: threading.Event) -> None:
        self.engine, self.shard, self.width, self.stop = engine, shard, width, stop
        self.finished: Dict[int, Outcome] = {}

    def drain(self, write: int) -> int:
        """Write every settled record from ``write`` on, in order; the next unwritten."""
        shard, out, progress = self.shard, self.shard.output, self.shard.progress
        end = shard.offset + shard.count
        while write < end:
            if write in shard.kept.spans:
                copied = out.copy_kept(shard.kept, write, end)
                progress.settled(shard.kept.tokens(write, write + copied), count=copied)
                write += copied
            elif write in shard.kept.dropped:
                out.drop(shard.kept.dropped[write])
                progress.settled(dropped=True)
                write += 1
            elif write in self.finished:
                self.settle(self.finished.pop(write))
                write += 1
            else:
                break
        if out.due():
            out.flush()
        return write

    def copy(self, first: int) -> int:
        """Write the records from ``first`` on that the reused runs give whole, up to
        ``COPY_LINES`` of them, fsynced together (issue 31: no task, no finished buffer;
        a kill loses at most those, which cost no request to make again); how many."""
        stop = min(self.shard.offset + self.shard.count, first + COPY_LINES)
        lines = self.engine.whole_lines(first, stop)
        out, progress = self.shard.output, self.shard.progress
        for line in lines:
            out.record(line)
        progress.settled(count=len(lines))
        for _ in lines:
            progress.cells(len(self.engine.llm), 0)
        if lines and out.due():
            out.flush()
            progress.tick()
        return len(lines)

    def settle(self, outcome: Outcome) -> None:
        """Write one settled record (the next index in order) and count it."""
        (self.shard.output.drop if outcome.dropped else self.shard.output.record)(outcome.line)
        self.shard.progress.settled(outcome.tokens, dropped=outcome.dropped)
        self.shard.progress.cells(*outcome.cells)

    async def run(self, first: int) -> int:
        """Produce from ``first``; returns the next unwritten index (the end unless
        stopped). GenerateError (``on_error = "fail"``) after writing what came before."""
        end = self.shard.offset + self.shard.count
        write = nxt = first
        running: Dict[asyncio.Future, int] = {}
        inline = not self.engine.recipe.aliases  # samplers only: nothing to wait for
        reusing = self.engine.reuse is not None and not self.engine.recipe.legacy
        try:
            while True:
                write = self.drain(write)
                self.shard.progress.tick()
                if write >= end or self.stop.is_set():
                    return write
                while nxt < end and nxt - write < self.width and not self.stop.is_set():
                    if nxt == write and reusing and not self.shard.kept:
                        copied = self.copy(nxt)
                        if copied:
                            write = nxt = nxt + copied
                            continue
                    if nxt not in self.shard.kept:
                        start = self.engine.reused(nxt) if reusing else None
                        if isinstance(start, Outcome) and nxt == write:  # none waits
                            self.settle(start)  # every LLM cell reused: no task, no wait
                            write = nxt + 1
                            if self.shard.output.due():
                                self.shard.output.flush()
                                self.shard.progress.tick()
                        elif isinstance(start, Outcome):
                            self.finished[nxt] = start
                        elif inline:
                            self.finished[nxt] = await self.engine.record(nxt)
                        else:
                            running[asyncio.ensure_future(self.engine.record(nxt, start))] = nxt
                    nxt += 1
                if inline:
                    await asyncio.sleep(0)
                    continue
                if running:
                    done, _ = await asyncio.wait(running, timeout=POLL_S,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    for future in done:
                        self.finished[running.pop(future)] = future.result()
        except GenerateError:
            self.drain(write)
            raise
        finally:
            for future in running:
                future.cancel()


def _endpoints(recipe: Recipe, contract: ClientEnv, preview: bool) -> Dict[str, str]:
    endpoints = contract.endpoints
    missing = [a for a in recipe.aliases if a not in endpoints]
    if missing and not preview:
        raise GenerateError(f"{ENDPOINTS} has no endpoint for model {missing[0]!r}")
    return {str(k): str(v) for k, v in endpoints.items()}


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
    """An event set by SIGUSR1/SIGTERM/SIGINT: stop, keep what is written."""
    stop = threading.Event()
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    return stop


def run_shard(plan: Plan, endpoints: Dict[str, str], shard: Shard,
              stop: Optional[threading.Event] = None, preview: bool = False,
              api_key: Optional[str] = None, reuse: Optional[Cells] = None) -> int:
    """Produce ``shard``; returns the records it now holds (``shard.count`` unless
    stopped); ``reuse``: cells of earlier runs (issue 31). Raises GenerateError,
    RecipeError, SeedError."""
    recipe = compile_recipe(plan, set(endpoints) if preview else None)
    spec = plan.client
    assert spec is not None
    limits = limiters(plan, recipe, shard.offset)
    aliases = {a: Alias(Endpoint(endpoints[a], api_key), lim, AliasCounters(lim))
               for a, lim in limits.items()}
    shard.progress.aliases = {a: x.counters for a, x in aliases.items()}
    if not preview:  # the proxy's affinity counters (issue 30); preview talks to engines
        for alias_name, alias in aliases.items():
            alias.counters.sampler = ProxySampler(endpoints[alias_name])
            alias.counters.sampler.start()
    seeds = SeedRows(spec.seed_data, spec.seed) if spec.seed_data is not None else None
    engine = Engine(recipe, spec.seed, "keep" if preview else spec.on_error,
                    spec.max_retries, spec.request_timeout_s, aliases, seeds, reuse,
                    {d.alias: model_identity(d) for d in plan.deployments})
    resumed = Resumed(shard.offset) if preview else shard.output.resume()
    if not preview and eligible(plan):  # what the records are made from (issue 31)
        tag = seed_tag(spec.seed_data)
        write_inputs(shard.output.records_path, tag, resumed.next_index > shard.offset,
                     shard.kept.files)
        engine.whole_tag = tag if reuse is not None else None
    if resumed.next_index > shard.offset:  # a later execution, or a restarted client
        print(f"generate: resuming after the {resumed.next_index - shard.offset} records "
              "already in the output", file=sys.stderr, flush=True)
    shard.progress.start_at(resumed.records + resumed.dropped, resumed.dropped,
                            resumed.tokens)
    if recipe.skipped:
        print(f"generate: preview: no endpoint for {', '.join(recipe.unavailable)}: "
              f"columns {', '.join(recipe.skipped)} left out", file=sys.stderr, flush=True)
    width = window(limits, shard.count)
    engine.dispatch_in_blocks(width)
    producer = Producer(engine, shard, width, stop or threading.Event())
    print(f"generate: records {shard.offset}..{shard.offset + shard.count - 1}, "
          f"{resumed.next_index - shard.offset} done before; up to {width} open at once; "
          + ("; ".join(f"{a} {_sizing(lim)}" for a, lim in sorted(limits.items()))
             or "no model"), file=sys.stderr, flush=True)
    try:
        written = drive(producer, resumed.next_index)
    finally:
        shard.output.close()
        for alias in aliases.values():
            if alias.counters.sampler is not None:
                alias.counters.sampler.stop()
        shard.progress.tick(force=True)
        for alias in aliases.values():
            alias.endpoint.close()
        if seeds is not None:
            seeds.close()
    return written - shard.offset


def drive(producer: Producer, first: int) -> int:
    """``asyncio.run(producer.run(first))``, except that once the producer was stopped by a
    signal, the requests still in flight are cancelled and get ``ABANDON_AFTER_S`` to end;
    any still running then is abandoned, not awaited.

    ``asyncio.run`` waits for every cancelled task to finish; on Python 3.11 an
    ``asyncio.wait_for`` whose exchange breaks just as it is cancelled (the proxy and the
    servers get the same SIGTERM) swallows the cancellation, and its retries (backoff
    sleeps) then held the stop for seconds, past Slurm's KillWait. The stopped client
    exits at once (``EXIT_PARTIAL``) with every record it wrote complete.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(producer.run(first))
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()  # each closes its connection as it ends (http.Endpoint.post)
        if pending and producer.stop.is_set():
            # a bounded wait: the ones still running after it are abandoned
            loop.run_until_complete(asyncio.wait(pending, timeout=ABANDON_AFTER_S))
        elif pending:  # finished or failed: every task ends, as asyncio.run does
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        if not producer.stop.is_set():
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def _sizing(limiter: Limiter) -> str:
    if not limiter.adaptive:
        return f"{limiter.current} in flight (fixed)"
    return f"{limiter.current} in flight, adaptive up to {limiter.ceiling}"


class Printed(Output):
    """Preview output: records on stdout as they come, nothing on disk."""

    def __init__(self) -> None:
        super().__init__(Path(os.devnull).parent, 0)

    def record(self, line: bytes) -> None:
        """Print one record."""
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()

    drop = record

    def due(self) -> bool:
        """Nothing is ever buffered."""
        return False

    def flush(self) -> None:
        """Flush stdout."""
        sys.stdout.buffer.flush()

    close = flush


def _shard_from_env(contract: ClientEnv, count: Optional[int]) -> Shard:
    offset = contract.record_offset
    if count is not None:  # preview
        return Shard(offset, count, Printed(), Progress(None, count), KeptRecords())
    count, output = contract.shard_output()
    folder = Path(output)
    progress = Path(contract.progress_file) if contract.progress_file else None
    kept = kept_records(contract.resume_dir, folder, offset, count)
    return Shard(offset, count, Output(folder, offset), Progress(progress, count), kept)


def add_reused(cells: Cells, run_id: str, folder: Path, first: int, count: int,
               plan: Optional[Plan]) -> bool:
    """Add the run at ``folder`` to ``cells`` for records ``first..first+count-1``, its
    records taken whole where ``plan`` (this run's, None: never) proves them the same;
    whether it does (``wholereuse``)."""
    same = plan is not None and eligible(plan) and provable(plan, folder)
    collecting = gc.isenabled()
    gc.disable()  # a bulk load of records that live as long as the shard: no cycles
    try:
        cells.add_run(run_id, run_files(folder, first, count), first, count, same)
    finally:
        if collecting:
            gc.enable()
    gc.freeze()  # and later collections need not walk them again
    return same


def reused_cells(sources: List[str], first: int, count: int,
                 plan: Optional[Plan] = None) -> Optional[Cells]:
    """The cells of ``RUN_ID=DIR`` runs for records ``first..first+count-1`` (None: no
    reuse), and their records that may be taken whole when ``plan`` (this run's) has the
    same recipe (``wholereuse.provable``); ValueError names a source that is malformed or
    not a run directory."""
    if not sources:
        return None
    cells = Cells()
    whole = []
    for source in sources:
        run_id, _, folder = source.partition("=")
        if not run_id or not folder or not RunLayout(Path(folder)).run_json.is_file():
            raise ValueError(f"--reuse {source}: not RUN_ID=DIR of a run directory")
        if add_reused(cells, run_id, Path(folder), first, count, plan):
            whole.append(run_id)
    print(f"generate: reuse: {len(cells.cells)} cells"
          + (f" and {len(cells.records)} records" if cells.records else "")
          + f" from {len(sources)} run(s)"
          + (f", {cells.damaged} damaged lines skipped" if cells.damaged else "")
          + (f"; records of {', '.join(whole)} taken whole where the seed data is the same"
             if whole else ""), file=sys.stderr, flush=True)
    for problem in cells.problems:
        print(f"generate: reuse: {visible(problem)}", file=sys.stderr, flush=True)
    return cells


def seed_data_at(plan: Plan, path: Optional[str]) -> Plan:
    """``plan`` with its seed data read from ``path`` (the client image's view of the
    plan's host path, given by the agent); unchanged when ``path`` is None."""
    spec = plan.client
    if path is None or spec is None or spec.seed_data is None:
        return plan
    return plan.replace(client=replace(spec, seed_data=replace(spec.seed_data, path=path)))


def main(argv: List[str]) -> int:
    """``python agent.pyz generate --plan PLAN [--preview N]``: one shard, or a preview."""
    parser = argparse.ArgumentParser(prog="agent generate")
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--preview", type=int, metavar="N",
                        help="print the first N records on stdout instead")
    parser.add_argument("--seed-data", metavar="PATH",
                        help="read the seed data here (the plan's path inside a client image)")
    parser.add_argument("--reuse", action="append", default=[], metavar="RUN_ID=DIR",
                        help="reuse LLM cells of this earlier run (repeatable; issue 31)")
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    # which interpreter runs the client (the host's, or an image's: docs/containers.md)
    print(f"generate: python {platform.python_version()} ({sys.executable})", file=sys.stderr,
          flush=True)
    data = read_json(args.plan)
    if data is None:
        print(f"generate: {args.plan}: missing", file=sys.stderr)
        return EXIT_CLIENT_CONFIG
    try:  # the configuration: wrong here is wrong again after a restart
        plan = seed_data_at(Plan.from_dict(data), args.seed_data)
        recipe = compile_recipe(plan)
        contract = ClientEnv.from_environ(os.environ)
        endpoints = _endpoints(recipe, contract, args.preview is not None)
        shard = _shard_from_env(contract, args.preview)
        cells = reused_cells(args.reuse, shard.offset, shard.count, plan)
    except (RecipeError, SeedError, ContractError, KeyError, ValueError, OSError) as err:
        print(f"generate: {err}", file=sys.stderr, flush=True)
        return EXIT_CLIENT_CONFIG
    try:
        written = run_shard(plan, endpoints, shard, stop, preview=args.preview is not None,
                            api_key=contract.api_key,
                            reuse=cells)
    except (RecipeError, SeedError, ContractError, KeyError, ValueError) as err:
        print(f"generate: {err}", file=sys.stderr, flush=True)
        return EXIT_CLIENT_CONFIG
    except (GenerateError, OSError) as err:  # HTTP errors, a full disk: maybe not again
        print(f"generate: {err}", file=sys.stderr, flush=True)
        return 1
    if written < shard.count:
        print(f"generate: stopped by a signal; kept {written} of {shard.count} records",
              file=sys.stderr, flush=True)
        os._exit(EXIT_PARTIAL)  # in-flight requests are abandoned, not awaited
    if args.preview is None:
        print(f"generate: wrote {shard.count} records to {shard.output.records_path}",
              file=sys.stderr, flush=True)
    if cells is not None:
        print(f"generate: reused {cells.reused} cells of earlier runs", file=sys.stderr,
              flush=True)
    return 0
