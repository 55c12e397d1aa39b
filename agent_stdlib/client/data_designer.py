"""The ``dd`` role: one shard of a NeMo Data Designer config (``docs/data-designer.md``).

``<client python> -I agent.pyz dd --plan PLAN`` runs under the client environment's Python,
the one with ``data-designer`` installed; ``data_designer`` is imported here only, inside
functions, so the agent's own import check (``python -I -S``) never needs it. The rules it
follows (model aliases, seed rows, renumbering) are in :mod:`agent_stdlib.client.ddshard`.

For the shard (``SYNTHBATCH_RECORD_OFFSET``, ``SYNTHBATCH_NUM_RECORDS``) it:

1. loads the config (YAML/JSON, or ``file.py:function`` returning a config builder) with
   the config's folder as working directory, so relative seed paths are the config's;
2. points every model config a column uses at the proxy of its deployment (an OpenAI
   provider at ``<endpoint>/v1``, the deployment's served model name) and drops the model
   configs no column uses;
3. gives Data Designer, as its seed dataset, the shard's own seed rows
   (:func:`ddshard.shard_seed_rows`) plus the global record index of each row
   (:data:`ddshard.INDEX_COLUMN`); a config without a seed dataset gets one of indices only;
4. runs ``DataDesigner.create`` for the records still missing and, as each row group is
   written, appends its rows to ``output/records-<offset>.jsonl`` (top-level ``"index"``,
   then Data Designer's columns), fsynced; rows Data Designer dropped are generated again
   in a further pass (``max_passes``), and counted as failures in ``progress.json``;
5. sorts the file by index at the end if row groups finished out of order.

Resume: synthbatch's own, not Data Designer's ``ResumeMode`` (that one needs Data Designer's
artifact folder, which lives on node-local scratch here and is not a valid candidate
output). A requeued execution keeps the complete records of its file (a torn last line is
cut) and generates only the missing indices; a retry copies the records an earlier
attempt kept (``SYNTHBATCH_RESUME_DIR``) first. SIGUSR1/SIGTERM/SIGINT stop at once with the
records written so far (exit ``EXIT_PARTIAL``); the row groups in flight are lost.

Offline and shared nodes: Data Designer's OpenTelemetry endpoint (port 9464) is off, NeMo
telemetry is off unless the environment turns it on, tiktoken never downloads (a word count
stands in for ``cl100k_base`` when the file is not in tiktoken's cache), and Data
Designer's home (``DATA_DESIGNER_HOME``) is a private temporary folder.

``--validate`` checks the installation, the config, the model aliases, the seed dataset and
the run config without generating anything and prints ``{"problems": [...], "notes":
[...]}`` as one JSON line (exit 1 with problems): ``synthbatch plan`` runs it on the login
node and preflight runs it before any server starts.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    BinaryIO,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from ..candidate import dd_profile_name
from ..clientenv import ClientEnv
from ..contracts import DataDesignerSpec, Plan, ProgressRecord, split_dd_config
from ..errors import AgentError
from ..resume import KeptRecords, resume_count, scan_kept
from ..statefile import read_json, write_json_atomic
from . import ddshard
from .generate import EXIT_PARTIAL

TESTED = "0.9.7"
SUPPORTED = (0, 9)  # major, minor
DEFAULT_RUN_CONFIG: Dict[str, Any] = {"buffer_size": 100}
INSTALL = (f"install it there: {{python}} -m pip install 'data-designer=={TESTED}' "
           "(scripts/client-env dd builds such an environment)")
PROVIDER_PREFIX = "synthbatch-"
PLACEHOLDER_ENDPOINT = "http://127.0.0.1:9"  # --validate never connects
TIKTOKEN_HINT = ("tiktoken's cl100k_base is not in its cache (TIKTOKEN_CACHE_DIR): Data "
                 "Designer's token statistics count words instead; nothing is downloaded")


class DDError(AgentError):
    """The shard cannot be generated; the message says why (one line)."""


def one_line(err: object) -> str:
    """An error message on one line."""
    return " ".join(str(err).split())


# ----------------------------------------------------------------------------- environment


def dd_environment(env: Mapping[str, str], home: str) -> Dict[str, str]:
    """The variables to set before ``data_designer`` is imported.

    NeMo telemetry off unless asked for; ``DATA_DESIGNER_HOME`` private (``home``) unless
    set, with managed assets (person datasets) still read from the user's
    ``~/.data-designer/managed-assets`` when that folder exists (nothing is created there).
    """
    out: Dict[str, str] = {}
    if "NEMO_TELEMETRY_ENABLED" not in env:
        out["NEMO_TELEMETRY_ENABLED"] = "false"
    if "DATA_DESIGNER_HOME" not in env:
        out["DATA_DESIGNER_HOME"] = home
        assets = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".data-designer",
                              "managed-assets")
        if "DATA_DESIGNER_MANAGED_ASSETS_PATH" not in env and os.path.isdir(assets):
            out["DATA_DESIGNER_MANAGED_ASSETS_PATH"] = assets
    return out


# tiktoken's cache rule for cl100k_base (``tiktoken.load.read_file_cached`` with the URL and
# hash of ``tiktoken_ext.openai_public.cl100k_base``): the file is ``<cache>/<sha1 of the
# URL>``, the cache being TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else
# ``<tmp>/data-gym-cache`` ("" turns it off); tiktoken downloads whenever that file is
# absent or its sha256 differs. Checked here, so the adapter imports nothing but
# ``data_designer``; a test holds the rule to the installed tiktoken, and should a tiktoken
# whose rule changed still reach for the network while the encoding loads, that thread is
# refused it (an audit hook) and the word counter stands in.
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_OFFLINE = threading.local()  # ``on`` while this thread loads the encoding
_HOOKED: List[bool] = []  # the audit hook is added once a process
NETWORK_EVENTS = ("socket.getaddrinfo", "socket.connect", "socket.gethostbyname")


def cl100k_cached(env: Mapping[str, str]) -> bool:
    """Whether tiktoken would load ``cl100k_base`` from its cache (no download)."""
    cache = env.get("TIKTOKEN_CACHE_DIR", env.get(
        "DATA_GYM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "data-gym-cache")))
    if not cache:
        return False
    key = hashlib.sha1(CL100K_URL.encode(), usedforsecurity=False).hexdigest()
    try:
        data = Path(cache, key).read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == CL100K_SHA256


def refuse_network_while_offline() -> None:
    """Add (once) the audit hook that refuses a thread the network while it is ``on``."""
    if not _HOOKED:
        sys.addaudithook(_refuse_network)  # for the process's life; idle unless ``on``
        _HOOKED.append(True)


def _refuse_network(event: str, _: Any) -> None:
    if event in NETWORK_EVENTS and getattr(_OFFLINE, "on", False):
        raise OSError(f"synthbatch keeps tiktoken offline: {event} refused")


def keep_tiktoken_offline() -> Optional[str]:
    """Never let tiktoken download; a word counter stands in when its file is not cached.

    Returns a note when the stand-in is used.
    """
    from data_designer.engine.utils import token_counting  # noqa: PLC0415

    if cl100k_cached(os.environ):
        refuse_network_while_offline()
        _OFFLINE.on = True
        try:
            token_counting.get_cl100k_base_tokenizer()
            return None
        except Exception:  # noqa: BLE001 - a cached file tiktoken cannot use, or refused
            pass
        finally:
            _OFFLINE.on = False
    token_counting.get_cl100k_base_tokenizer = lambda: _WordTokens()
    return TIKTOKEN_HINT


class _WordTokens:
    """Stands in for a tiktoken encoding: one token per word or punctuation mark."""

    def encode(self, text: str, **_: Any) -> List[str]:
        """The words and punctuation marks of ``text``."""
        import re  # noqa: PLC0415

        return re.findall(r"\w+|[^\w\s]", text)


def installed_version() -> Optional[str]:
    """The installed ``data-designer`` distribution's version, or None."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("data-designer")
    except metadata.PackageNotFoundError:
        return None


def version_problem(version: Optional[str], python: str) -> Tuple[Optional[str], Optional[str]]:
    """(problem, note) about the installed version (pure)."""
    if version is None:
        return (f"data-designer is not installed for {python}; "
                + INSTALL.format(python=python)), None
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None, f"data-designer {version}: cannot tell the version; tested with {TESTED}"
    if (major, minor) < SUPPORTED:
        return (f"data-designer {version} is installed for {python}; synthbatch needs "
                f"0.9.x: " + INSTALL.format(python=python)), None
    if (major, minor) > SUPPORTED:
        return None, (f"data-designer {version} is newer than the 0.9.x synthbatch supports "
                      f"(tested with {TESTED}; see docs/data-designer.md)")
    return None, None


# ----------------------------------------------------------------------------- the config


@dataclass
class Session:
    """A loaded config and what the checks found."""

    spec: DataDesignerSpec
    builder: Any = None
    designer: Any = None
    targets: Dict[str, str] = field(default_factory=dict)  # DD alias -> deployment
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def changed_config(spec: DataDesignerSpec) -> Optional[str]:
    """Why the config file is not the one the run pinned at submit (None: it is, or the
    login node could not read it then); one line naming the file and both digests."""
    if not spec.config_sha256:
        return None
    path = split_dd_config(spec.config)[0]
    try:
        with open(path, "rb") as handle:
            got = hashlib.sha256(handle.read()).hexdigest()
    except OSError as err:
        return f"{path}: cannot be read ({err.strerror})"
    if got == spec.config_sha256:
        return None
    return (f"{path}: changed since the run was submitted (sha256 {got}, the run pinned "
            f"{spec.config_sha256}); restore it, or submit a new run")


def load_builder(config: str) -> Any:
    """The config builder of ``config``; the config's folder becomes the working directory."""
    from data_designer.config.config_builder import (  # noqa: PLC0415
        BuilderConfig,
        DataDesignerConfigBuilder,
    )
    from data_designer.config.data_designer_config import DataDesignerConfig  # noqa: PLC0415

    path, function = split_dd_config(config)
    folder = os.path.dirname(path) or "."
    os.chdir(folder)
    if not function:
        return DataDesignerConfigBuilder.from_config(path)
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("synthbatch_dd_config", path)
    if spec is None or spec.loader is None:
        raise DDError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = getattr(module, function, None)
    if not callable(made):
        raise DDError(f"{path}: has no function {function!r}")
    result = made()
    if isinstance(result, DataDesignerConfigBuilder):
        return result
    if isinstance(result, DataDesignerConfig):
        result = BuilderConfig(data_designer=result)
    if isinstance(result, (BuilderConfig, dict)):
        return DataDesignerConfigBuilder.from_config(result)
    raise DDError(f"{config}: returned {type(result).__name__}, expected a "
                  "DataDesignerConfigBuilder")


def config_problems(err: Exception, config: str) -> List[str]:
    """One line per problem of a config Data Designer rejects."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        try:
            return [f"{config}: {'.'.join(str(p) for p in e.get('loc', ()))}: "
                    f"{one_line(e.get('msg', ''))}" for e in errors()]
        except Exception:  # noqa: BLE001 - not a pydantic error after all
            pass
    lines = [one_line(line) for line in str(err).splitlines() if line.strip()]
    return [f"{config}: {line}" for line in lines] or [f"{config}: {type(err).__name__}"]


def used_aliases(builder: Any) -> Dict[str, List[str]]:
    """Model alias -> the columns that use it."""
    used: Dict[str, List[str]] = {}
    for column in builder.get_column_configs():
        getter = getattr(column, "get_model_aliases", None)
        aliases = getter() if callable(getter) else [getattr(column, "model_alias", None)]
        for alias in aliases:
            if alias is not None:
                used.setdefault(alias, []).append(column.name)
    return used


def run_config(spec: DataDesignerSpec) -> Any:
    """Data Designer's RunConfig: synthbatch's defaults, the run's fields, metrics off."""
    from data_designer.config.run_config import RunConfig  # noqa: PLC0415

    return RunConfig(**{**DEFAULT_RUN_CONFIG, **spec.run_config, "otel_metrics_port": None})


def providers(plan: Plan, endpoints: Mapping[str, str]) -> List[Any]:
    """One OpenAI-compatible provider per deployment, at its proxy's ``/v1``."""
    from data_designer.config.models import ModelProvider  # noqa: PLC0415

    return [ModelProvider(name=PROVIDER_PREFIX + dep.alias,
                          endpoint=endpoints.get(dep.alias, PLACEHOLDER_ENDPOINT).rstrip("/")
                          + "/v1", provider_type="openai", api_key="synthbatch-proxy")
            for dep in plan.deployments]


def point_models(builder: Any, plan: Plan, targets: Mapping[str, str]) -> None:
    """Every model config a column uses -> its deployment's served name and provider; the
    model configs no column uses are dropped (their providers are not there)."""
    for config in list(builder.model_configs):
        builder.delete_model_config(config.alias)
        target = targets.get(config.alias)
        if target is not None:
            builder.add_model_config(config.model_copy(update={
                "model": plan.deployment(target).served_name,
                "provider": PROVIDER_PREFIX + target}))


def open_session(plan: Plan, endpoints: Mapping[str, str], artifacts: str) -> Session:
    """Load and check the config; ``session.problems`` lists what is wrong (one line each)."""
    spec = plan.client_data_designer
    if spec is None:
        raise DDError("the plan has no Data Designer client (client_data_designer)")
    session = Session(spec=spec)
    problem, note = version_problem(installed_version(), sys.executable)
    session.notes += [note] if note else []
    if problem:
        session.problems.append(problem)
        return session
    note = keep_tiktoken_offline()
    session.notes += [note] if note else []
    changed = changed_config(spec)
    if changed:
        session.problems.append(changed)
        return session
    try:
        session.builder = load_builder(spec.config)
    except Exception as err:  # noqa: BLE001 - whatever the config's code raises
        session.problems += config_problems(err, spec.config)
        return session
    builder = session.builder
    used = used_aliases(builder)
    defined = [m.alias for m in builder.model_configs]
    session.targets, problems = ddshard.resolve_models(
        defined, used, spec.models, [d.alias for d in plan.deployments])
    session.problems += problems
    columns = [c.name for c in builder.get_column_configs()]
    session.problems += ddshard.reserved_columns(columns, "column")
    try:
        settings = run_config(spec)
    except Exception as err:  # noqa: BLE001 - a pydantic ValidationError
        session.problems += config_problems(err, "client.run_config")
        return session
    if session.problems:
        return session
    from data_designer.interface.data_designer import DataDesigner  # noqa: PLC0415

    session.designer = DataDesigner(artifact_path=artifacts,
                                    model_providers=providers(plan, endpoints))
    session.designer.set_run_config(settings)
    point_models(builder, plan, session.targets)
    violations = collect_violations()
    try:
        session.designer.validate(builder)
    except Exception as err:  # noqa: BLE001 - Data Designer's InvalidConfigError and kin
        errors = [v for v in violations if str(getattr(v.level, "value", v.level)) == "ERROR"]
        session.problems += [violation_line(v, spec.config) for v in errors] \
            or config_problems(err, spec.config)
    session.notes += [violation_line(v, spec.config) for v in violations
                      if str(getattr(v.level, "value", v.level)) != "ERROR"]
    return session


def collect_violations() -> List[Any]:
    """A list that Data Designer's config check fills with its violations (it only logs
    them, then raises one generic error); empty if this version checks differently."""
    from data_designer.engine import compiler  # noqa: PLC0415

    found: List[Any] = []
    shown = getattr(compiler, "rich_print_violations", None)
    if callable(shown):
        def keep(violations: List[Any]) -> None:
            found.extend(violations)
            shown(violations)
        compiler.rich_print_violations = keep
    return found


def violation_line(violation: Any, config: str) -> str:
    """One Data Designer violation as one line."""
    column = getattr(violation, "column", None)
    where = f"column {column!r}: " if column else ""
    return f"{config}: {where}{one_line(getattr(violation, 'message', violation))}"


# ----------------------------------------------------------------------------- seed rows


@dataclass
class Seed:
    """The shard's seed rows (a DataFrame aligned with the shard's records), or none."""

    frame: Any  # pandas.DataFrame or None (the config has no seed dataset)
    offset: int
    sampling: Any  # Data Designer's SamplingStrategy (ordered), to hand back

    def for_indices(self, indices: Sequence[int]) -> Any:
        """The seed dataset of one pass: the rows of ``indices`` plus the index column."""
        import data_designer.lazy_heavy_imports as lazy  # noqa: PLC0415

        if self.frame is None:
            return lazy.pd.DataFrame({ddshard.INDEX_COLUMN: list(indices)})
        rows = self.frame.iloc[[i - self.offset for i in indices]].reset_index(drop=True)
        rows[ddshard.INDEX_COLUMN] = list(indices)
        return rows


def shard_seed(session: Session, offset: int, count: int) -> Seed:
    """Read the seed rows of records ``offset .. offset+count-1`` (only those)."""
    import data_designer.lazy_heavy_imports as lazy  # noqa: PLC0415
    from data_designer.config.seed import IndexRange, PartitionBlock, SamplingStrategy  # noqa
    from data_designer.engine.resources.seed_reader import SeedReaderRegistry  # noqa: PLC0415
    from data_designer.interface.data_designer import DEFAULT_SEED_READERS  # noqa: PLC0415

    seed_config = session.builder.get_seed_config()
    if seed_config is None:
        return Seed(None, offset, SamplingStrategy.ORDERED)
    reader = SeedReaderRegistry(DEFAULT_SEED_READERS).get_reader(
        seed_config.source, session.designer.secret_resolver)
    size = reader.get_seed_dataset_size()
    selection = seed_config.selection_strategy
    if isinstance(selection, PartitionBlock):
        selection = selection.to_index_range(size)
    first, last = ddshard.selected_range(size, *(
        (selection.start, selection.end) if isinstance(selection, IndexRange) else ()))
    rows = ddshard.shard_seed_rows(offset, count, first, last,
                                   seed_config.sampling_strategy == SamplingStrategy.SHUFFLE)
    parts, position = [], {}
    for start, end in ddshard.row_ranges(rows):
        batches = reader.create_batch_reader(batch_size=min(end - start + 1, 10_000),
                                             index_range=IndexRange(start=start, end=end),
                                             shuffle=False)
        part = _read_all(batches)
        if len(part) != end - start + 1:
            raise DDError(f"seed dataset: read {len(part)} rows of [{start}, {end}]")
        for k in range(len(part)):
            position[start + k] = len(position)
        parts.append(part)
    frame = lazy.pd.concat(parts, ignore_index=True)
    problems = ddshard.reserved_columns(frame.columns, "seed column")
    if problems:
        raise DDError("; ".join(problems))
    return Seed(frame.iloc[[position[r] for r in rows]].reset_index(drop=True), offset,
                SamplingStrategy.ORDERED)


def _read_all(batches: Any) -> Any:
    import data_designer.lazy_heavy_imports as lazy  # noqa: PLC0415

    frames = []
    while True:
        try:
            frames.append(batches.read_next_batch().to_pandas())
        except StopIteration:
            break
    return lazy.pd.concat(frames, ignore_index=True) if frames else lazy.pd.DataFrame()


# ----------------------------------------------------------------------------- output


class ShardFile:
    """The shard's JSONL file: complete records appended (fsynced), by global index."""

    def __init__(self, output: Path, offset: int, count: int) -> None:
        self.output, self.offset, self.count = output, offset, count
        self.path = output / f"records-{offset:012d}.jsonl"
        self.lock = threading.Lock()
        for stale in output.glob(f".{self.path.name}.*"):
            stale.unlink()  # a sort that was cut off
        resume_count(self.path)  # cuts a torn last line
        self.present: Set[int] = set(scan_kept(output, offset, count).spans)
        self.kept = len(self.present)
        self.profiles: List[Dict[str, Any]] = []  # Data Designer's, one per pass
        self.handle: BinaryIO = open(self.path, "ab")

    def adopt(self, kept: KeptRecords) -> int:
        """Copy the records of an earlier attempt this file does not have; how many."""
        todo = [i for i in sorted(kept.spans) if i not in self.present]
        handles: Dict[int, BinaryIO] = {}
        try:
            start = 0
            while start < len(todo):
                end = start
                while end + 1 < len(todo) and todo[end + 1] == todo[end] + 1:
                    end += 1
                kept.copy_run(todo[start], todo[end] + 1, self.handle, handles)
                start = end + 1
        finally:
            for handle in handles.values():
                handle.close()
        self.present.update(todo)
        self._sync()
        return len(todo)

    def append(self, lines: Sequence[Tuple[int, bytes]]) -> int:
        """Append the records not written yet (fsynced); how many were new."""
        with self.lock:
            new = [(i, line) for i, line in lines
                   if i not in self.present and self.offset <= i < self.offset + self.count]
            self.handle.write(b"".join(line for _, line in new))
            self._sync()
            self.present.update(i for i, _ in new)
            return len(new)

    def _sync(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def finish(self) -> None:
        """Close the file sorted by index, one line per record (rewritten through a hidden
        temp file if it is not)."""
        with self.lock:
            self._sync()
            self.handle.close()
            kept = scan_kept(self.output, self.offset, self.count)
            order = [kept.spans[i][:2] for i in range(self.offset, self.offset + self.count)
                     if i in kept.spans]
            if len(order) != self.count:
                raise DDError(f"{self.path}: holds {len(order)} usable records of "
                              f"{self.count}")
            if order == sorted(order) and len({n for n, _ in order}) == 1 \
                    and not kept.skipped:
                return  # else rewritten: in index order, without unusable lines
            temp = self.output / f".{self.path.name}.sorting"
            handles: Dict[int, BinaryIO] = {}
            try:
                with open(temp, "xb") as out:
                    kept.copy_run(self.offset, self.offset + self.count, out, handles)
                    out.flush()
                    os.fsync(out.fileno())
            finally:
                for handle in handles.values():
                    handle.close()
            os.replace(temp, self.path)
            fd = os.open(self.output, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class Progress:
    """``progress.json``: records present, failures (rows Data Designer dropped)."""

    def __init__(self, path: Optional[Path], total: int, kept: int) -> None:
        self.path, self.total, self.kept = path, total, kept
        self.failures = 0
        self.started = time.monotonic()

    def write(self, done: int) -> None:
        """Publish the counters now."""
        if self.path is None:
            return
        elapsed = max(1e-6, time.monotonic() - self.started)
        record = ProgressRecord(records_done=done, records_total=self.total, tokens=0,
                                requests_per_s=max(0, done - self.kept) / elapsed,
                                updated_at=time.time(), failures=self.failures)
        write_json_atomic(self.path, record.to_dict())


# ----------------------------------------------------------------------------- generation


def batch_number(path: str) -> Optional[int]:
    """``.../batch_00003.parquet`` -> 3 (Data Designer's row-group file name), else None."""
    stem = Path(path).stem
    digits = stem.rpartition("_")[2]
    return int(digits) if stem.startswith("batch_") and digits.isdigit() else None


def run_pass(session: Session, seed: Seed, targets: Sequence[int], shard: ShardFile,
             progress: Progress, number: int, artifacts: str) -> int:
    """One ``DataDesigner.create`` for ``targets``; returns how many records it added.

    Each row group Data Designer writes is appended at once; the rows it asked for and did
    not get count as failures as they happen (:func:`fill` makes the count exact).
    """
    import data_designer.lazy_heavy_imports as lazy  # noqa: PLC0415
    from data_designer.config.seed_source_dataframe import DataFrameSeedSource  # noqa
    from data_designer.interface.errors import DataDesignerProfilingError  # noqa: PLC0415

    buffer_size = int(session.designer.run_config.buffer_size)
    added = [0]

    def written(path: Any) -> None:
        lines = [ddshard.record_line(row) for row in lazy.pq.read_table(str(path)).to_pylist()]
        added[0] += shard.append(lines)
        batch = batch_number(str(path))
        if batch is not None:
            asked = ddshard.batch_targets(targets, batch, buffer_size)
            progress.failures += len(set(asked) - {i for i, _ in lines})
        progress.write(len(shard.present))

    session.builder.with_seed_dataset(DataFrameSeedSource(df=seed.for_indices(targets)),
                                      sampling_strategy=seed.sampling)
    try:
        results = session.designer.create(session.builder, num_records=len(targets),
                                          dataset_name=f"pass-{number}",
                                          artifact_path=artifacts, on_batch_complete=written)
    except DataDesignerProfilingError as err:  # the records are written; stats are extra
        print(f"dd: Data Designer's profile failed (records kept): {one_line(err)}",
              file=sys.stderr, flush=True)
    else:
        keep_profile(shard, number, added[0], results)
    return added[0]


def keep_profile(shard: ShardFile, number: int, added: int, results: Any) -> None:
    """Add Data Designer's profile of pass ``number`` to ``output/.dd-profile-<offset>.json``
    (``{"passes": [{"pass", "records", "profile"}]}``, written atomically): merge puts it
    in the dataset card. A profile that cannot be read or written is only reported."""
    try:
        profile = results.load_analysis().model_dump(mode="json")
        shard.profiles.append({"pass": number, "records": added, "profile": profile})
        write_json_atomic(shard.output / dd_profile_name(shard.offset),
                          {"passes": shard.profiles})
    except Exception as err:  # noqa: BLE001 - the records are written; the profile is extra
        print(f"dd: Data Designer's profile was not kept (records kept): {one_line(err)}",
              file=sys.stderr, flush=True)


PassFn = Callable[[List[int], int], int]  # (record indices to generate, pass number) -> added


def fill(shard: ShardFile, progress: Progress, max_passes: int, one_pass: PassFn) -> None:
    """Generate the shard's missing records in at most ``max_passes`` passes: each pass asks
    for the indices still missing (rows Data Designer dropped come back in the next one);
    a pass that adds nothing ends it. DDError when records are still missing."""
    todo = ddshard.missing(shard.present, shard.offset, shard.count)
    number = 0
    while todo and number < max_passes:
        number += 1
        print(f"dd: pass {number}: generating {len(todo)} of {shard.count} records",
              file=sys.stderr, flush=True)
        failures = progress.failures
        try:
            added = one_pass(todo, number)
        except Exception as err:  # noqa: BLE001 - Data Designer's errors end the shard
            raise DDError(f"Data Designer failed in pass {number}: {one_line(err)}; the "
                          f"{len(shard.present)} records written are kept") from err
        progress.failures = failures + len(todo) - added  # exact, whatever the file names
        progress.write(len(shard.present))
        left = ddshard.missing(shard.present, shard.offset, shard.count)
        if len(left) == len(todo):
            break
        todo = left
    if todo:
        raise DDError(f"{len(todo)} of {shard.count} records are still missing after "
                      f"{number} Data Designer pass(es) (it dropped them; see client.log); "
                      f"the {shard.count - len(todo)} written are kept")


def generate(session: Session, shard: ShardFile, progress: Progress, artifacts: str) -> None:
    """Fill every missing record of the shard with Data Designer (:func:`fill`)."""
    if not ddshard.missing(shard.present, shard.offset, shard.count):
        return
    seed = shard_seed(session, shard.offset, shard.count)
    fill(shard, progress, session.spec.max_passes,
         lambda todo, number: run_pass(session, seed, todo, shard, progress, number,
                                       artifacts))


def stop_on_signals() -> threading.Event:
    """An event set by SIGUSR1/SIGTERM/SIGINT."""
    stop = threading.Event()
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    return stop


def _kept(resume: Optional[str], output: Path, offset: int,
          count: int) -> Optional[KeptRecords]:
    if not resume or Path(resume).resolve() == output.resolve():
        return None
    return scan_kept(Path(resume), offset, count)


def run_shard(plan: Plan, stop: threading.Event, artifacts: str) -> int:
    """Generate this step's shard; the exit status."""
    contract = ClientEnv.from_environ(os.environ)
    offset = contract.record_offset
    count, output_dir = contract.shard_output()
    output = Path(output_dir)
    progress_file = contract.progress_file
    endpoints = contract.endpoints
    shard = ShardFile(output, offset, count)
    kept = _kept(contract.resume_dir, output, offset, count)
    if kept is not None:
        copied = shard.adopt(kept)
        print(f"dd: resuming: {copied} records copied from {contract.resume_dir}",
              file=sys.stderr, flush=True)
    progress = Progress(Path(progress_file) if progress_file else None, count,
                        len(shard.present))
    progress.write(len(shard.present))
    if shard.kept:
        print(f"dd: resuming: {shard.kept} records kept in {shard.path}", file=sys.stderr,
              flush=True)
    session = open_session(plan, endpoints, artifacts)
    for note in session.notes:
        print(f"dd: note: {note}", file=sys.stderr, flush=True)
    if session.problems:
        for problem in session.problems:
            print(f"dd: {problem}", file=sys.stderr, flush=True)
        return 2
    failure: List[BaseException] = []

    def work() -> None:
        try:
            generate(session, shard, progress, artifacts)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            failure.append(err)

    worker = threading.Thread(target=work, name="data-designer", daemon=True)
    worker.start()
    while worker.is_alive():
        if stop.wait(0.2):
            with shard.lock:  # no row group is half-appended past this point
                shard.handle.flush()
                os.fsync(shard.handle.fileno())
                progress.write(len(shard.present))
                print(f"dd: stopped by a signal; kept {len(shard.present)} of {count} records "
                      f"in {shard.path}", file=sys.stderr, flush=True)
                shutil.rmtree(artifacts, ignore_errors=True)
                os._exit(EXIT_PARTIAL)  # the row groups in flight are abandoned
    if failure:
        err = failure[0]
        if isinstance(err, AgentError):
            raise err
        raise DDError(f"{type(err).__name__}: {one_line(err)}; the {len(shard.present)} "
                      "records written are kept") from err
    shard.finish()
    progress.write(len(shard.present))
    print(f"dd: wrote {count} records to {shard.path} ({progress.failures} dropped row(s) "
          "generated again)", file=sys.stderr, flush=True)
    return 0


def load_plan(source: str) -> Plan:
    """The plan from a file, or from stdin for ``-``."""
    if source == "-":
        return Plan.from_dict(json.loads(sys.stdin.read()))
    data = read_json(Path(source))
    if data is None:
        raise DDError(f"{source}: missing")
    return Plan.from_dict(data)


def main(argv: List[str]) -> int:
    """``python agent.pyz dd --plan PLAN [--validate]``: run (or check) one shard."""
    parser = argparse.ArgumentParser(prog="agent dd")
    parser.add_argument("--plan", required=True, help="plan.json, or - for stdin")
    parser.add_argument("--validate", action="store_true",
                        help="check the config and print one JSON line; generate nothing")
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    artifacts = tempfile.mkdtemp(prefix="synthbatch-dd-")
    try:
        os.environ.update(dd_environment(os.environ, os.path.join(artifacts, "home")))
        plan = load_plan(args.plan)
        if args.validate:
            session = open_session(plan, {}, artifacts)
            print(json.dumps({"problems": session.problems, "notes": session.notes}),
                  flush=True)
            return 1 if session.problems else 0
        return run_shard(plan, stop, artifacts)
    except (AgentError, KeyError, ValueError, OSError) as err:
        print(f"dd: {one_line(err)}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutil.rmtree(artifacts, ignore_errors=True)
