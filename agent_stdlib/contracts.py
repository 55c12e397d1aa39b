"""Wire contracts between the control plane and the allocation agent.

Plan, run, submission, attempt, readiness, progress, result and winner records are
defined here, once; the control plane imports them. Every record carries
``schema_version`` and round-trips through ``to_dict``/``from_dict``, which rejects
unknown keys, missing keys, wrong types and unknown schema versions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Type,
    TypeVar,
)

from . import arrays
from .errors import AgentError
from .statefile import canonical

SCHEMA_VERSION = 1
# Ports a multi-node replica's ranks may use from ``ReplicaSpec.dist_port`` on: the planner
# keeps them apart, preflight checks them. SGLang derives its own from --dist-init-addr up
# to +6; vLLM uses the first (--master-port).
DIST_PORTS = 8
MIN_PYTHON = (3, 9)  # the agent's floor: preflight on the node, the login-node checks
# Server ports (preflight's ``assign_ports``): an allocation that may share its nodes
# listens in block ``key % PORT_SLOTS`` of ``max(PORT_STRIDE, offsets)`` ports above
# ``port_base``; an exclusive one on ``port_base + offset``.
PORT_SLOTS = 512  # distinct port blocks per port_base
PORT_STRIDE = 16  # ports per block (servers of one allocation)
# Request header a client sets to ask the endpoint proxy for replica affinity: requests
# with the same value go to the same replica while its load is within the proxy's bound
# (agent_stdlib/proxy/route.py). Value: 1-128 visible ASCII characters.
AFFINITY_HEADER = "X-Synthbatch-Affinity"


def port_span(base: int, offsets: int, exclusive: bool) -> Tuple[int, int]:
    """The lowest and highest port an allocation with ``offsets`` port offsets may listen
    on, whatever its job id."""
    if exclusive:
        return base, base + offsets - 1
    return base, base + (PORT_SLOTS - 1) * max(PORT_STRIDE, offsets) + offsets - 1

T = TypeVar("T", bound="Record")


class ContractError(AgentError, ValueError):
    """A record does not match its contract; the message names the field."""


Convert = Callable[[Any, str], Any]  # (value, where) -> checked value


def _converter(hint: Any) -> Convert:
    """The checking converter of one field type, built once per type (status verifies
    thousands of records a refresh: re-inspecting the type hints per value was ~3/4 of
    the cost)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return lambda value, where: value
    if origin is typing.Union:
        inner = _converter([a for a in args if a is not type(None)][0])
        if type(None) not in args:
            return inner
        return lambda value, where: None if value is None else inner(value, where)
    if dataclasses.is_dataclass(hint):
        def record(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise ContractError(f"{where}: expected an object")
            return _from_fields(hint, value, where)
        return record
    if origin in (tuple, Tuple):
        item = _converter(args[0])

        def items(value: Any, where: str) -> Any:
            if not isinstance(value, list):
                raise ContractError(f"{where}: expected a list")
            return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))
        return items
    if origin in (dict, Dict):
        entry = _converter(args[1])

        def entries(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise ContractError(f"{where}: expected an object")
            return {str(k): entry(v, f"{where}.{k}") for k, v in value.items()}
        return entries
    if hint in (int, float, str, bool):
        def scalar(value: Any, where: str) -> Any:
            if hint is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
                raise ContractError(f"{where}: expected {hint.__name__}")
            return value
        return scalar

    def unsupported(value: Any, where: str) -> Any:  # pragma: no cover
        raise ContractError(f"{where}: unsupported type {hint!r}")
    return unsupported


@functools.cache
def _fields(cls: Any) -> Tuple[FrozenSet[str], Tuple[Tuple[str, Convert, bool], ...]]:
    """Field names of a record class, and per field its converter and whether it is
    required (evaluating the type hints is the slow part: done once per class)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    specs = tuple((f.name, _converter(hints[f.name]),
                   f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING) for f in fields)
    return frozenset(f.name for f in fields), specs


def _from_fields(cls: Any, data: Dict[str, Any], where: str) -> Any:
    names, specs = _fields(cls)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ContractError(f"{where}: unknown field {unknown[0]!r}")
    kwargs = {}
    for name, convert, required in specs:
        if name in data:
            kwargs[name] = convert(data[name], f"{where}.{name}")
        elif required:
            raise ContractError(f"{where}: missing field {name!r}")
    return cls(**kwargs)


_PLAIN = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _field_names(cls: type) -> Optional[Tuple[str, ...]]:
    """The field names of a dataclass (None for any other type), looked up once."""
    if not dataclasses.is_dataclass(cls):
        return None
    return tuple(f.name for f in dataclasses.fields(cls))


def _to_plain(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    names = _field_names(kind)
    if names is not None:
        return {name: _to_plain(getattr(value, name)) for name in names}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Record:
    """Base of every record: plain frozen data with a schema version."""

    def to_dict(self) -> Dict[str, Any]:
        """Return the record as JSON-ready plain data."""
        return _to_plain(self)

    def to_json(self) -> str:
        """Return canonical JSON (sorted keys) for the record."""
        return canonical(self.to_dict()) + "\n"

    @classmethod
    def from_dict(cls: Type[T], data: Dict[str, Any]) -> T:
        """Build the record from plain data, rejecting anything off-contract."""
        name = cls.__name__
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ContractError(
                f"{name}.schema_version: unsupported {version!r} (this agent knows "
                f"{SCHEMA_VERSION})"
            )
        return _from_fields(cls, data, name)

    def replace(self: T, **changes: Any) -> T:
        """Return a copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class ShardSpec:
    """One shard: a contiguous range of record indices."""

    index: int
    record_offset: int
    num_records: int
    concurrency: Optional[int] = None  # fixed requests in flight per alias (a benchmark point)


@dataclass(frozen=True)
class ReplicaSpec:
    """Where one server replica runs: allocation node(s), GPU indices there, preferred ports.

    A replica of several nodes (tensor/pipeline parallel across nodes) runs one rank per
    node of ``nodes``; its leader (rank 0, the one that serves HTTP) is on ``node``, the
    first of them, and listens for the other ranks on ``dist_port``.
    """

    index: int
    node: int  # relative node index in the allocation (srun --relative); the leader's
    gpus: Tuple[int, ...]  # GPU indices on that node (on each of ``nodes``)
    port: int  # preferred port (port_base + offset, unique within the allocation)
    nodes: Tuple[int, ...] = ()  # every node the replica spans, leader first; () = (node,)
    dist_port: int = 0  # preferred first port of the ranks' distributed init (0: one node)

    @property
    def span(self) -> Tuple[int, ...]:
        """The allocation nodes this replica runs on, leader first."""
        return self.nodes or (self.node,)


@dataclass(frozen=True)
class MountSpec:
    """One bind mount of a container: host path -> container path."""

    host: str
    container: str
    read_only: bool


@dataclass(frozen=True)
class ContainerSpec:
    """A sealed image and how a runtime wraps a step (``agent_stdlib/containers.py``)."""

    runtime: str  # "pyxis" | "apptainer" | "charliecloud"
    image: str  # image alias
    path: str  # absolute host path of the image file
    sha256: str  # pinned at `image add`
    mounts: Tuple[MountSpec, ...]  # in mount order (parents first); includes the run dir
    executable: str = ""  # runtime binary; "" means the runtime's default name on PATH


@dataclass(frozen=True)
class DeploymentSpec:
    """One model alias served by ``replicas`` copies of one server command."""

    alias: str
    engine: str
    model: str
    served_name: str
    command: Tuple[str, ...]  # argv; {host} and {port} are filled in by the agent
    env: Dict[str, str]
    gpus_per_replica: int
    replicas: int
    startup_timeout_s: float
    readiness_path: str
    max_queued_requests: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    nodes: int = 1
    placement: Tuple[ReplicaSpec, ...] = ()  # one per replica, in replica order
    secret_env: Dict[str, str] = field(default_factory=dict)  # step var -> job env var name
    container: Optional[ContainerSpec] = None
    # One replica across nodes: ``command`` is every rank's argv with {node_rank},
    # {leader_host} and {dist_port} left for the agent; ranks > 0 append ``follower_args``.
    nodes_per_replica: int = 1
    follower_args: Tuple[str, ...] = ()

    @property
    def gpus_per_rank(self) -> int:
        """GPUs of one replica on each node it spans (all of them on one node)."""
        return self.gpus_per_replica // max(1, self.nodes_per_replica)


@dataclass(frozen=True)
class ColumnSpec:
    """One column of the built-in generator's recipe (``docs/generator.md``).

    ``params`` hold the column kind's own fields, checked at plan time
    (``control/config/columns.py``); the generator reads them by name.
    """

    name: str
    type: str  # a kind of agent_stdlib.recipe.kinds.KINDS
    params: Dict[str, Any] = field(default_factory=dict)
    drop: bool = False  # computed and usable by others, left out of the record


@dataclass(frozen=True)
class SeedDataSpec:
    """The seed data file of a recipe and how records pick its rows."""

    path: str
    order: str = "in-order"  # "in-order" | "shuffle" | "sample"
    fields: Tuple[str, ...] = ()  # the fields the recipe uses (every row must have them)
    rows: int = 0  # the rows counted at plan time; 0: the file was not visible there


@dataclass(frozen=True)
class GenerateSpec:
    """The built-in generator: a recipe of ``columns``, or the older single prompt template.

    With ``columns`` empty, ``model`` and ``prompt_template`` (over ``{index}``) make one
    chat completion per record with the record shape of that form (``prompt``,
    ``completion``, ``usage``, ...). ``concurrency`` None means adaptive per model alias.
    Every field has a default so plans written before a field existed still load.
    """

    model: str = ""  # deployment alias of the prompt_template form
    prompt_template: str = ""
    system_prompt: Optional[str] = None
    max_tokens: int = 256
    temperature: float = 0.7
    concurrency: Optional[int] = None  # fixed requests in flight per alias; None: adaptive
    max_retries: int = 5
    request_timeout_s: float = 600.0
    seed: int = 0
    on_error: str = "fail"  # "fail" | "drop" | "keep"
    columns: Tuple[ColumnSpec, ...] = ()
    seed_data: Optional[SeedDataSpec] = None
    container: Optional[ContainerSpec] = None  # a client image the generator runs in
    context: Optional[str] = None  # recipe-level context template, first in LLM requests
    reuse: Dict[str, str] = field(default_factory=dict)  # run id -> run dir (issue 31)


@dataclass(frozen=True)
class ResourceSpec:
    """What one allocation asks of the scheduler."""

    partition: Optional[str]
    account: Optional[str]
    qos: Optional[str]
    time_limit: str
    nodes: int
    gpus: int
    gpu_request: str  # "gres" | "gpus"
    cpus: int
    mem_mb: int
    reservation: Optional[str] = None
    options: Dict[str, str] = field(default_factory=dict)  # allow-listed; "" = flag


# The environment allow-list, in one home. A job gets from the submitting shell only
# JOB_ENV, the profile's ``env_allow`` and the secrets' names (``sbatch --export=`` of
# :meth:`Plan.job_env`; Slurm adds its own ``SLURM_*``); a step or the proxy gets
# only BASE_ENV, ``env_allow`` and ``SLURM_*`` of the agent's environment, plus what the
# agent sets for it (``agent_stdlib.allocation.steps.step_env``). docs/reliability.md
# "Environment" has what was measured.
# A client step that exits with this status says its configuration is wrong (usage, plan,
# recipe, seed data; argparse's and the Data Designer adapter's status too): the agent
# never restarts it inside the allocation (agent_stdlib/allocation/restarts.py)
EXIT_CLIENT_CONFIG = 2
RESTART_CLIENT = "client"  # the client's key in ReadinessRecord.restarts

BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "SHIV_ROOT", "TZ")
JOB_ENV = tuple(sorted(set(BASE_ENV) - {"SHIV_ROOT"}))  # the batch script sets SHIV_ROOT
# The batch script exports it; the agent requeues on SIGUSR1 while below it (default 0).
MAX_REQUEUES_ENV = "SYNTHBATCH_MAX_REQUEUES"
# Proxy variables a step may be allowed (env_allow); the agent then keeps loopback out of
# them (NO_PROXY), so a client never sends its requests to the run's proxy through them.
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "ALL_PROXY")
LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class RuntimeSpec:
    """How the agent launches steps and where it may listen."""

    launcher: str  # "srun" | "local"
    python: str
    port_base: int
    env_allow: Tuple[str, ...]
    step_mem_mb: int
    grace_s: float
    secrets: Tuple[str, ...] = ()  # environment names that may carry secret values


@dataclass(frozen=True)
class CommandClientSpec:
    """A user client: an argv run as the client step, optionally in a client image."""

    argv: Tuple[str, ...]
    env: Dict[str, str]
    secret_env: Dict[str, str] = field(default_factory=dict)
    container: Optional[ContainerSpec] = None


@dataclass(frozen=True)
class DataDesignerSpec:
    """A NeMo Data Designer config run by the ``dd`` role under the client environment's
    Python (``agent_stdlib/client/data_designer.py``, ``docs/data-designer.md``)."""

    config: str  # the config file (YAML/JSON) as the step sees it, or "<file.py>:<function>"
    python: str  # the client environment's interpreter (inside the image, with one)
    models: Dict[str, str] = field(default_factory=dict)  # DD alias -> deployment alias
    run_config: Dict[str, Any] = field(default_factory=dict)  # Data Designer RunConfig fields
    max_passes: int = 3  # Data Designer runs per shard to fill the rows it dropped
    env: Dict[str, str] = field(default_factory=dict)
    secret_env: Dict[str, str] = field(default_factory=dict)
    container: Optional[ContainerSpec] = None
    config_sha256: str = ""  # the config file's digest at submit ("": not readable there)


def split_dd_config(config: str) -> Tuple[str, str]:
    """``"/x/build.py:builder"`` -> ``("/x/build.py", "builder")``; a file -> ``(file, "")``."""
    path, colon, function = config.rpartition(":")
    return (path, function) if colon else (config, "")


@dataclass(frozen=True)
class ArraySpec:
    """One Slurm array of a run: task ``first_task + i`` runs shard ``first_shard + i``.

    ``first_task`` is 0 but for a run whose tasks share one array with other runs (the
    benchmark cases of one shape, ``control.runs.shared.submit_shared``): its tasks are
    ``[first_task, first_task + count)`` of that array and of any retry array.
    """

    index: int
    first_shard: int
    count: int
    first_task: int = 0


@dataclass(frozen=True)
class Plan(Record):
    """The immutable, fully resolved description of every allocation of a run."""

    run_id: str
    name: str
    total_records: int
    shards: Tuple[ShardSpec, ...]
    deployments: Tuple[DeploymentSpec, ...]
    client: Optional[GenerateSpec]  # None when client_command or client_data_designer is set
    resources: ResourceSpec
    runtime: RuntimeSpec
    max_attempts: int
    schema_version: int = SCHEMA_VERSION
    client_command: Optional[CommandClientSpec] = None
    arrays: Tuple[ArraySpec, ...] = ()  # empty: one array, task id == shard index
    array_throttle: int = 0
    resume: str = "auto"  # "auto" | "always" | "never"
    output_format: str = "jsonl"
    agent_sha256: str = ""  # the agent bundle digest, when known at plan time
    client_data_designer: Optional[DataDesignerSpec] = None
    # restarts of a failed client / crashed server inside one allocation ([retries]
    # in_allocation); 0 (also a plan written before this field): the attempt fails at once
    restarts_in_allocation: int = 0

    def __post_init__(self) -> None:
        given = [name for name in ("client", "client_command", "client_data_designer")
                 if getattr(self, name) is not None]
        if not given:
            raise ContractError("Plan.client: expected an object (or a client_command or "
                                "client_data_designer)")
        if len(given) > 1:
            raise ContractError(f"Plan.{given[1]}: must be null when {given[0]} is set")

    @property
    def client_container(self) -> Optional[ContainerSpec]:
        """The client step's image (None: the client runs on the host)."""
        spec = self.client_command or self.client_data_designer or self.client
        return spec.container if spec is not None else None

    @property
    def client_secret_env(self) -> Dict[str, str]:
        """The client step's secrets: step variable -> job variable."""
        spec = self.client_command or self.client_data_designer
        return dict(spec.secret_env) if spec is not None else {}

    def job_env(self) -> Tuple[str, ...]:
        """The names ``sbatch --export=`` passes from the submitting shell to the job:
        ``JOB_ENV``, ``runtime.env_allow`` and every secret's name (sorted)."""
        names = set(JOB_ENV) | set(self.runtime.env_allow) | set(self.runtime.secrets)
        names.update(self.client_secret_env.values())
        for dep in self.deployments:
            names.update(dep.secret_env.values())
        return tuple(sorted(names))

    def shard(self, index: int) -> ShardSpec:
        """Return the shard with ``index`` or raise ContractError."""
        if 0 <= index < len(self.shards) and self.shards[index].index == index:
            return self.shards[index]
        raise ContractError(f"plan has no shard {index}")

    def array_task(self, shard: int) -> Tuple[Optional[int], int]:
        """``(array index, task id)`` that runs ``shard`` (``agent_stdlib.arrays``)."""
        self.shard(shard)
        try:
            return arrays.array_task(self.arrays, shard)
        except arrays.ArrayError as err:
            raise ContractError(str(err)) from err

    def array_tasks(self, shards: Iterable[int]) -> Iterator[Tuple[int, Optional[int], int]]:
        """``(shard, array index, task id)`` for many shards (``arrays.array_tasks``)."""
        try:
            for shard, index, task in arrays.array_tasks(self.arrays, shards):
                self.shard(shard)
                yield shard, index, task
        except arrays.ArrayError as err:
            raise ContractError(str(err)) from err

    def deployment(self, alias: str) -> DeploymentSpec:
        """Return the deployment serving ``alias`` or raise ContractError."""
        for dep in self.deployments:
            if dep.alias == alias:
                return dep
        raise ContractError(f"plan has no deployment {alias!r}")


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RunRecord(Record):
    """``run.json``: the commit marker of a submitted run, written last."""

    run_id: str
    name: str
    created_at: float
    plan_sha256: str
    agent_pyz: str
    agent_sha256: str
    backend: str
    job_name: str
    shard_count: int
    schema_version: int = SCHEMA_VERSION
    # What ``plan`` warned about at submit (login-node checks), and the command-line
    # overrides of the profile (``-p/-A/-q/-t/--reservation``: field -> value). Both have
    # defaults: run.json files written before they existed still read.
    warnings: Tuple[str, ...] = ()
    overrides: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SubmissionRecord(Record):
    """``submissions/NNNN.json``: one sbatch call and the attempts it carries."""

    number: int
    argv: Tuple[str, ...]
    job_id: Optional[str]
    attempts: Dict[str, int]  # shard index (as string) -> attempt number
    submitted_at: float
    released: bool
    schema_version: int = SCHEMA_VERSION
    # An array shared with other runs (benchmark cases of one shape): its job name (None:
    # the run's own ``job_name``), every submission in it as ``<run id>/<number>`` (this
    # one included) and the task ids of this record's attempts in it.
    job_name: Optional[str] = None
    group: Tuple[str, ...] = ()
    tasks: Tuple[int, ...] = ()


@dataclass(frozen=True)
class AttemptRecord(Record):
    """``attempt.json``: one try at one shard; revisions increase by one per write."""

    run_id: str
    shard: int
    attempt: int
    state: str
    revision: int
    updated_at: float
    submission: Optional[int] = None
    job_id: Optional[str] = None
    node: Optional[str] = None
    restarts: int = 0
    reason: Optional[str] = None
    partial_records: Optional[int] = None  # records kept in output/ by a stopped execution
    resume_from: Optional[int] = None  # earlier attempt whose kept output this one continues
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True)
class BackendStatus:
    """One replica as seen by readiness probes."""

    url: str
    ready: bool


@dataclass(frozen=True)
class ReadinessRecord(Record):
    """``readiness.json``: what the allocation is serving right now (revisioned)."""

    shard: int
    attempt: int
    execution: int
    state: str
    revision: int
    updated_at: float
    endpoints: Dict[str, str] = field(default_factory=dict)
    backends: Dict[str, Tuple[BackendStatus, ...]] = field(default_factory=dict)
    reason: Optional[str] = None
    schema_version: int = SCHEMA_VERSION
    # restarts inside this execution: "client" / "server ALIAS/REPLICA" -> how many
    # (agent_stdlib/allocation/restarts.py; docs/retry.md "Restarts inside the allocation")
    restarts: Dict[str, int] = field(default_factory=dict)


def restarts_text(counts: Mapping[str, int]) -> str:
    """``ReadinessRecord.restarts`` in words: ``client 1, server gen/0 1`` (the client
    first, then the servers by name; "" when nothing was restarted)."""
    names = sorted(counts, key=lambda n: (n != RESTART_CLIENT, n))
    return ", ".join(f"{name} {counts[name]}" for name in names)


@dataclass(frozen=True)
class CacheProgress:
    """Prefix-cache reuse and affinity routing for one alias (issue 30), for ``progress.json``.

    ``prompt_tokens_cached`` counts the prompt tokens the engine answered from its prefix
    cache (llama.cpp ``timings.cache_n``, OpenAI ``usage.prompt_tokens_details``); the
    ``affinity_*`` counters and ``replica_hit_rate`` (replica URL -> the engine's own
    prefix-cache hit ratio, vLLM/SGLang ``/metrics``) are sampled from the proxy's
    ``/metrics``, over the proxy's lifetime.
    """

    prompt_tokens_cached: int = 0
    affinity_hits: int = 0  # keyed requests the proxy sent to their key's home replica
    affinity_fallbacks: int = 0  # keyed requests whose home was over the load bound
    replica_hit_rate: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ColumnTokens:
    """One LLM column's answered requests, tokens and latencies on its alias (issue 32:
    tokens attribute a shared deployment's GPU time to columns; ``latency_s``, the sum of
    the answers' latencies (client: sent -> answer), gives the mean latency that status
    splits into proxy queue and engine time)."""

    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0


@dataclass(frozen=True)
class AliasProgress:
    """The generator's traffic to one model alias, for ``progress.json``."""

    requests: int = 0  # answered requests (any status)
    tokens_in: int = 0  # prompt tokens the engine reported
    tokens_out: int = 0  # completion tokens the engine reported
    errors: Dict[str, int] = field(default_factory=dict)  # kind ("429", "5xx", ...) -> count
    concurrency: int = 0  # the current limit of requests in flight
    in_flight: int = 0
    cache: CacheProgress = field(default_factory=CacheProgress)  # issue 30's reuse figures
    columns: Dict[str, ColumnTokens] = field(default_factory=dict)  # LLM column -> its part


@dataclass(frozen=True)
class ProgressRecord(Record):
    """``progress.json``: the client's own count of work done (about once a second).

    ``records_done`` counts every record settled, dropped ones included.
    """

    records_done: int
    records_total: int
    tokens: int
    requests_per_s: float  # records settled per second
    updated_at: float
    schema_version: int = SCHEMA_VERSION
    records_dropped: int = 0
    aliases: Dict[str, AliasProgress] = field(default_factory=dict)
    failures: int = 0  # records the client gave up on so far (it may generate them again)
    started_at: Optional[float] = None  # wall time the generator started (endpoints ready)
    first_record_at: Optional[float] = None  # wall time the first record of this run settled
    # issue 31: LLM cells this execution took from reused runs / generated, and the records
    # every LLM cell of which was reused (no request sent; ``requests_per_s`` leaves them out)
    cells_reused: int = 0
    cells_generated: int = 0
    records_reused: int = 0


# Serving telemetry (issue 32): the agent's samples of each replica's own /metrics
TELEMETRY_SERIES = ("running", "waiting", "kv_cache_usage", "gen_tokens_per_s",
                    "proxy_in_flight")  # one TelemetryPoint value per replica, in this order


@dataclass(frozen=True)
class ReplicaTelemetry:
    """The last sample of one replica (None: the engine does not export that figure)."""

    alias: str
    url: str
    engine: str = ""  # "vllm", "sglang", "llamacpp" (/metrics or /slots), "" if unreadable
    running: Optional[float] = None  # requests the engine is running
    waiting: Optional[float] = None  # requests queued inside the engine
    kv_cache_usage: Optional[float] = None  # 0-1 share of the KV cache in use
    prefix_hit_rate: Optional[float] = None  # 0-1 prompt tokens found cached, since last sample
    gen_tokens_per_s: Optional[float] = None  # generated tokens/s since the last sample
    proxy_in_flight: Optional[int] = None  # requests the alias's proxy has at this replica
    error: Optional[str] = None  # why the last sample failed (the previous values stay)


@dataclass(frozen=True)
class ProxyTelemetry:
    """One alias's proxy counters (over the proxy's lifetime)."""

    requests: int = 0
    responses_429: int = 0  # the proxy's own backpressure 429s plus engines' 429s
    retries: int = 0
    timed: int = 0  # answered proxied requests, and their seconds:
    queue_s: float = 0.0  # arrival at the proxy -> forwarded to a backend (last attempt)
    upstream_s: float = 0.0  # forwarded -> the whole response written back


@dataclass(frozen=True)
class TelemetryPoint:
    """One sample in the attempt's time series: per replica (``replicas`` order), the
    ``TELEMETRY_SERIES`` figures."""

    at: float
    values: Tuple[Tuple[Optional[float], ...], ...]


@dataclass(frozen=True)
class TelemetryRecord(Record):
    """``telemetry.json``: the agent's serving samples of one attempt (written every
    ``interval_s``, bounded in size: ``agent_stdlib/allocation/telemetry.py``)."""

    interval_s: float
    updated_at: float
    replicas: Tuple[ReplicaTelemetry, ...] = ()
    proxies: Dict[str, ProxyTelemetry] = field(default_factory=dict)
    series: Tuple[TelemetryPoint, ...] = ()
    schema_version: int = SCHEMA_VERSION
    # where the execution's time went (wall times; None: not reached)
    started_at: Optional[float] = None  # the agent began this execution
    ready_at: Optional[float] = None  # every server answered its readiness probe
    stopping_at: Optional[float] = None  # the agent began stopping the servers
    stopped_at: Optional[float] = None  # every server and step was gone


@dataclass(frozen=True)
class FileEntry:
    """One output file of a candidate, relative to the attempt's ``output/``."""

    path: str
    sha256: str
    bytes: int
    records: int


@dataclass(frozen=True)
class ResultManifest(Record):
    """``result.json``: the candidate manifest the agent computed from ``output/``."""

    shard: int
    attempt: int
    records: int
    files: Tuple[FileEntry, ...]
    created_at: float
    schema_version: int = SCHEMA_VERSION
    dropped: int = 0  # records the client gave up on (on_error = "drop"), listed in output/


@dataclass(frozen=True)
class WinnerRecord(Record):
    """``winner.json``: immutable, first writer wins; names the attempt and digests."""

    shard: int
    attempt: int
    records: int
    result_sha256: str
    files: Tuple[FileEntry, ...]
    created_at: float
    schema_version: int = SCHEMA_VERSION
    dropped: int = 0


def sha256_bytes(payload: bytes) -> str:
    """Hex sha256 of ``payload``."""
    return hashlib.sha256(payload).hexdigest()


def dd_check_report(stdout: str, stderr: str, code: int) -> Tuple[List[str], List[str]]:
    """``(problems, notes)`` of ``agent.pyz dd --validate``: its last JSON line of stdout
    (``{"problems": [...], "notes": [...]}``); without one, a problem saying why."""
    for line in reversed(stdout.splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and isinstance(report.get("problems"), list):
            problems = [str(p) for p in report["problems"]]
            notes = [str(n) for n in report.get("notes") or []]
            if not problems and code != 0:
                problems = [f"the check exited with status {code}"]
            return problems, notes
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return [f"the check printed no verdict (exit status {code}"
            + (f": {lines[-1]}" if lines else "") + ")"], []
