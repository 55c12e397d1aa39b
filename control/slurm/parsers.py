"""Pure parsers of Slurm's text output (tested on outputs recorded from Slurm 22.05).

Formats: ``sbatch --parsable``; ``squeue -h -o '%i|%T|%r'``; ``sacct -n -P -X
--format=JobID,State,ExitCode``; ``sinfo -h -o '%P|%a|%D|%t'``; ``MaxArraySize`` of
``scontrol show config``; partitions, nodes, node features, reservations, and the
accounting's associations and QOS (the login-node checks of ``plan``). Every malformed line is a
ParseError, never another exception. (``--json`` is not used: on 22.05 ``sacct --json``
reports wrong exit codes and ``squeue --json`` ignores its filters.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from synthbatch.agent_stdlib.arrays import task_job_id

JOB_ID = re.compile(r"([0-9]{1,10})(;[A-Za-z0-9_.-]+)?")
MAX_JOB_ID = 2**32 - 1
MAX_TASKS = 4_000_001  # above any MaxArraySize; guards against absurd ranges
# 12 | 12_3 | 12_[4-9%2] | 12_[1,3-5] | 12.batch | 12+1 (heterogeneous component)
ROW_ID = re.compile(r"(?P<job>[0-9]{1,10})(?:_(?P<task>[0-9]{1,7})|_\[(?P<range>[0-9,%-]+)\])?"
                    r"(?P<rest>[.+][A-Za-z0-9_.+-]+)?")
STATE = re.compile(r"[A-Z][A-Z_]*")
DIGITS = re.compile(r"[0-9]+")

# Every job state Slurm 22.05 prints, by what it means for an observer.
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
    "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
    "RESV_DEL_HOLD", "SPECIAL_EXIT", "POWER_UP_NODE", "UPDATE_DB",
})
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED",
})
KNOWN_STATES = ACTIVE_STATES | TERMINAL_STATES

MAX_ARRAY_SIZE = re.compile(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)


def parse_max_array_size(text: str) -> Optional[int]:
    """``MaxArraySize`` from ``scontrol show config`` output; None if absent or invalid."""
    match = MAX_ARRAY_SIZE.search(text)
    if not match:
        return None
    value = int(match.group(1))
    return value if value > 0 else None


class ParseError(ValueError):
    """Slurm printed something this parser does not understand."""


@dataclass(frozen=True)
class JobRow:
    """One line of squeue or sacct: a job, an array task, or a pending range of tasks."""

    job_id: str  # as printed: "12", "12_3", "12_[4-9%2]", "12.batch"
    state: str  # upper-case base state, e.g. RUNNING, CANCELLED
    reason: Optional[str] = None  # squeue reason, or sacct's "by UID" of CANCELLED
    exit_code: Optional[int] = None
    signal: Optional[int] = None

    @property
    def terminal(self) -> bool:
        """True for a state the job never leaves."""
        return self.state in TERMINAL_STATES

    @property
    def known(self) -> bool:
        """True for a state this module knows."""
        return self.state in KNOWN_STATES


def parse_sbatch_id(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` (``12345`` or ``12345;cluster``)."""
    text = stdout.strip()
    match = JOB_ID.fullmatch(text)
    if not match or int(match.group(1)) > MAX_JOB_ID:
        raise ParseError(f"sbatch printed {text[:80]!r}, not a job id")
    return match.group(1)


def expand_tasks(spec: str) -> Tuple[int, ...]:
    """Task ids of an array spec such as ``4-9%2`` or ``1,3-5`` (the throttle is dropped)."""
    body, _, throttle = spec.partition("%")
    if throttle and not DIGITS.fullmatch(throttle):
        raise ParseError(f"malformed array throttle in {spec!r}")
    tasks: List[int] = []
    for part in body.split(","):
        low, dash, high = part.partition("-")
        # ASCII digits only: str.isdigit() holds for '²', which int() refuses
        if not DIGITS.fullmatch(low) or (dash and not DIGITS.fullmatch(high)):
            raise ParseError(f"malformed array range {spec!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or len(tasks) + last - first >= MAX_TASKS:
            raise ParseError(f"malformed array range {spec!r}")
        tasks.extend(range(first, last + 1))
    return tuple(tasks)


def split_job_id(job_id: str) -> Tuple[str, Optional[Tuple[int, ...]]]:
    """``12_3`` -> ("12", (3,)); ``12_[4-6]`` -> ("12", (4, 5, 6)); ``12`` -> ("12", None).

    Step ids (``12.batch``) keep their suffix on the job part.
    """
    match = ROW_ID.fullmatch(job_id)
    if not match or int(match.group("job")) > MAX_JOB_ID:
        raise ParseError(f"malformed job id {job_id[:60]!r}")
    job = match.group("job") + (match.group("rest") or "")
    if match.group("task") is not None:
        return job, (int(match.group("task")),)
    if match.group("range") is not None:
        return job, expand_tasks(match.group("range"))
    return job, None


def _exit(field: str) -> Tuple[Optional[int], Optional[int]]:
    if not field:
        return None, None
    parts = field.split(":")
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ParseError(f"malformed exit code {field!r}")
    return int(parts[0]), int(parts[1])


def _fields(text: str, count: int, what: str) -> Iterable[List[str]]:
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != count or not parts[0] or not parts[1]:
            raise ParseError(f"malformed {what} line {line[:120]!r}")
        yield parts


def _check_row(job_id: str, state: str, line: str, what: str) -> None:
    if not STATE.fullmatch(state):
        raise ParseError(f"malformed {what} line {line[:120]!r}: state {state[:30]!r}")
    split_job_id(job_id)


def parse_squeue(text: str) -> List[JobRow]:
    """Rows of ``squeue -h -o '%i|%T|%r'``, in output order."""
    rows: List[JobRow] = []
    for job_id, state, reason in _fields(text, 3, "squeue"):
        _check_row(job_id, state, "|".join((job_id, state, reason)), "squeue")
        rows.append(JobRow(job_id=job_id, state=state,
                           reason=reason if reason not in ("", "None") else None))
    return rows


def parse_sacct(text: str) -> List[JobRow]:
    """Rows of ``sacct -n -P -X --format=JobID,State,ExitCode``, in output order.

    ``CANCELLED by 0`` becomes state CANCELLED with reason ``by 0``.
    """
    rows: List[JobRow] = []
    for job_id, state_text, exit_text in _fields(text, 3, "sacct"):
        state, _, by = state_text.partition(" ")
        _check_row(job_id, state, "|".join((job_id, state_text, exit_text)), "sacct")
        if by and not re.fullmatch(r"by [0-9]{1,10}", by):
            raise ParseError(f"malformed sacct state {state_text[:60]!r}")
        code, sig = _exit(exit_text)
        rows.append(JobRow(job_id=job_id, state=state, reason=by or None, exit_code=code,
                           signal=sig))
    return rows


def index_rows(rows: Iterable[JobRow]) -> Dict[str, JobRow]:
    """Rows keyed by every job id they cover: ``12``, or ``12_N`` for each array task.

    Later rows win (sacct prints the newest record of a requeued job last). A pending
    range row is indexed under each of its tasks; step rows (``12.batch``) are skipped.
    """
    index: Dict[str, JobRow] = {}
    for row in rows:
        job, tasks = split_job_id(row.job_id)
        if not job.isdigit():
            continue
        if tasks is None:
            index[job] = row
        else:
            for task in tasks:
                index[task_job_id(job, task)] = row
    return index


@dataclass(frozen=True)
class Partition:
    """One partition as ``sinfo -h -o '%P|%a|%D|%t'`` reports it (one row per state)."""

    name: str
    default: bool
    available: bool
    nodes: int
    state: str


def parse_sinfo(text: str) -> List[Partition]:
    """Rows of ``sinfo -h -o '%P|%a|%D|%t'``."""
    found: List[Partition] = []
    for name, avail, nodes, state in _fields(text, 4, "sinfo"):
        if not nodes.isdigit() or avail not in ("up", "down", "drain", "inact"):
            raise ParseError(f"malformed sinfo line {'|'.join((name, avail, nodes, state))!r}")
        found.append(Partition(name=name.rstrip("*"), default=name.endswith("*"),
                               available=avail == "up", nodes=int(nodes), state=state))
    return found


# ----------------------------------------------------------------------------- partitions
# ``scontrol show partition -o [NAME]``: one ``Key=Value ...`` line per partition;
# ``sinfo -N -h -p NAME -o '%N|%c|%m|%G|%T'``: one line per node of the partition.
# ``sacct -n -P -X -D --format=JobID,ElapsedRaw,AllocTRES``: what each job used.

UNLIMITED = None  # how an UNLIMITED (or absent) limit is parsed
PARTITION_KEY = re.compile(r"(?:^|\s)([A-Za-z]+)=")
SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
GRES_GPUS = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")
TRES_GPUS = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")


@dataclass(frozen=True)
class PartitionLimits:
    """One partition's limits (None: UNLIMITED), from ``scontrol show partition -o``."""

    name: str
    default: bool
    state: str  # UP | DOWN | DRAIN | INACTIVE
    total_nodes: int
    max_nodes: Optional[int]
    max_time_s: Optional[int]
    max_mem_per_node_mb: Optional[int]
    max_cpus_per_node: Optional[int]
    allow_accounts: Optional[Tuple[str, ...]]  # None: ALL
    allow_qos: Optional[Tuple[str, ...]]  # None: ALL
    deny_accounts: Tuple[str, ...] = ()
    deny_qos: Tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeShape:
    """One node as ``sinfo -N`` reports it: CPUs, memory (MB), GPUs, state."""

    name: str
    cpus: int
    mem_mb: int
    gpus: int
    gres: str  # as printed: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)``
    state: str  # idle, mixed, allocated, drained, down*, ...

    @property
    def usable(self) -> bool:
        """False for a node that takes no jobs now (down, drained, failing, ...)."""
        base = self.state.rstrip("*~#!%$@^-").lower()
        return base not in ("down", "drained", "draining", "drain", "fail", "failing",
                            "future", "inval", "maint", "unknown", "power_down",
                            "powered_down", "reboot_issued")


def seconds_of(text: str) -> Optional[int]:
    """A Slurm duration (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``MM``) in seconds; None
    for UNLIMITED/INFINITE/NONE; ParseError otherwise."""
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    match = SLURM_TIME.fullmatch(text)
    if not match:
        raise ParseError(f"malformed time {text[:40]!r}")
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if b is None:  # minutes, or D-HH
        hours, minutes, secs = (a, 0, 0) if days is not None else (0, a, 0)
    elif c is None:  # D-HH:MM or MM:SS
        hours, minutes, secs = (a, b, 0) if days is not None else (0, a, b)
    else:
        hours, minutes, secs = a, b, c
    return (days or 0) * 86400 + (hours or 0) * 3600 + (minutes or 0) * 60 + secs


def _limit(value: Optional[str], what: str) -> Optional[int]:
    if value is None or value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    if not value.isascii() or not value.isdigit():
        raise ParseError(f"malformed {what} {value[:40]!r}")
    return int(value)


def _names(value: Optional[str]) -> Optional[Tuple[str, ...]]:
    if value is None or value.upper() == "ALL":
        return None
    return tuple(v for v in value.split(",") if v)


def partition_fields(line: str) -> Dict[str, str]:
    """``Key=Value`` pairs of one ``-o`` line (values may hold ``=``, as TRES does)."""
    marks = list(PARTITION_KEY.finditer(line))
    fields: Dict[str, str] = {}
    for mark, following in zip(marks, marks[1:] + [None]):
        end = following.start() if following is not None else len(line)
        fields[mark.group(1)] = line[mark.end():end].strip()
    return fields


def parse_partitions(text: str) -> List[PartitionLimits]:
    """Rows of ``scontrol show partition -o``."""
    found: List[PartitionLimits] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = partition_fields(line)
        name = f.get("PartitionName")
        if not name or "State" not in f or not f.get("TotalNodes", "").isdigit():
            raise ParseError(f"malformed partition line {line[:120]!r}")
        max_time = f.get("MaxTime", "UNLIMITED")
        found.append(PartitionLimits(
            name=name, default=f.get("Default") == "YES", state=f["State"],
            total_nodes=int(f["TotalNodes"]), max_nodes=_limit(f.get("MaxNodes"), "MaxNodes"),
            max_time_s=seconds_of(max_time),
            max_mem_per_node_mb=_limit(f.get("MaxMemPerNode"), "MaxMemPerNode"),
            max_cpus_per_node=_limit(f.get("MaxCPUsPerNode"), "MaxCPUsPerNode"),
            allow_accounts=_names(f.get("AllowAccounts")), allow_qos=_names(f.get("AllowQos")),
            deny_accounts=_names(f.get("DenyAccounts")) or (),
            deny_qos=_names(f.get("DenyQos")) or ()))
    return found


def gpus_of(gres: str) -> int:
    """GPUs in a node's gres string (``gpu:4``, ``gpu:a100:8(S:0-1)``, several types summed)."""
    return sum(int(n) for n in GRES_GPUS.findall(re.sub(r"\([^)]*\)", "", gres)))


def parse_node_shapes(text: str) -> List[NodeShape]:
    """Rows of ``sinfo -N -h -o '%N|%c|%m|%G|%T'`` (a node listed twice is kept once)."""
    found: Dict[str, NodeShape] = {}
    for name, cpus, mem, gres, state in _fields(text, 5, "sinfo node"):
        mem_mb = mem.rstrip("+")
        if not cpus.isdigit() or not mem_mb.isdigit() or not state:
            line = "|".join((name, cpus, mem, gres, state))
            raise ParseError(f"malformed sinfo node line {line[:120]!r}")
        found.setdefault(name, NodeShape(name=name, cpus=int(cpus), mem_mb=int(mem_mb),
                                         gpus=gpus_of(gres), gres=gres, state=state))
    return list(found.values())


@dataclass(frozen=True)
class JobUsage:
    """What one job (or array task, or one requeued execution of it) used."""

    job_id: str
    elapsed_s: int
    gpus: int  # gres/gpu of AllocTRES (all nodes of the job); 0 when none or not allocated


def parse_usage(text: str) -> List[JobUsage]:
    """Rows of ``sacct -n -P -X -D --format=JobID,ElapsedRaw,AllocTRES``."""
    found: List[JobUsage] = []
    for job_id, elapsed, tres in _fields(text, 3, "sacct usage"):
        if not elapsed.isascii() or not elapsed.isdigit():
            raise ParseError(f"malformed sacct usage line {'|'.join((job_id, elapsed, tres))!r}")
        split_job_id(job_id)
        match = TRES_GPUS.search(tres)
        found.append(JobUsage(job_id=job_id, elapsed_s=int(elapsed),
                              gpus=int(match.group(1)) if match else 0))
    return found


def parse_sacct_usage(text: str) -> Tuple[List[JobRow], List[JobUsage]]:
    """Rows of ``sacct -n -P -X -D --format=JobID,State,ExitCode,ElapsedRaw,AllocTRES``:
    the states (as ``parse_sacct``; later rows win) and the usage (as ``parse_usage``)."""
    lines = list(_fields(text, 5, "sacct"))
    return (parse_sacct("".join("|".join(f[:3]) + "\n" for f in lines)),
            parse_usage("".join("|".join((f[0], f[3], f[4])) + "\n" for f in lines)))


# ----------------------------------------------------------------------------- access
# ``sacctmgr -n -P show assoc where user=U format=Account,Partition,QOS``: one line per
# association of the user; ``sacctmgr -n -P show qos format=Name``; ``scontrol show
# reservation -o``; ``sinfo -N -h -p NAME -o '%N|%f'``.

NULL = ("", "(null)")


@dataclass(frozen=True)
class Association:
    """One association of a user: an account, maybe for one partition only, its QOS."""

    account: str
    partition: Optional[str]  # None: every partition
    qos: Tuple[str, ...]  # () when sacctmgr shows none (no restriction known)


def _lines(text: str, count: int, what: str) -> Iterable[List[str]]:
    """``|``-separated lines of ``count`` fields (empty fields allowed, the first not)."""
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != count or not parts[0].strip():
            raise ParseError(f"malformed {what} line {line[:120]!r}")
        yield [p.strip() for p in parts]


def parse_associations(text: str) -> List[Association]:
    """Rows of ``sacctmgr -n -P show assoc ... format=Account,Partition,QOS``."""
    return [Association(account=account, partition=partition or None,
                        qos=tuple(q for q in qos.split(",") if q))
            for account, partition, qos in _lines(text, 3, "sacctmgr association")]


def parse_qos_names(text: str) -> List[str]:
    """Rows of ``sacctmgr -n -P show qos format=Name``."""
    return [name for (name,) in _lines(text, 1, "sacctmgr qos")]


@dataclass(frozen=True)
class Reservation:
    """One reservation as ``scontrol show reservation -o`` reports it."""

    name: str
    state: str  # ACTIVE | INACTIVE
    start: str
    users: Tuple[str, ...]  # () when not restricted by user; ``-name`` denies
    accounts: Tuple[str, ...]  # () when not restricted by account; ``-name`` denies
    partition: Optional[str]


def _list(value: Optional[str]) -> Tuple[str, ...]:
    return () if value is None or value in NULL else tuple(v for v in value.split(",") if v)


def parse_reservations(text: str) -> List[Reservation]:
    """Rows of ``scontrol show reservation -o`` (``No reservations in the system``: none)."""
    found: List[Reservation] = []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("No reservations"):
            continue
        f = partition_fields(line)
        if not f.get("ReservationName") or not f.get("State"):
            raise ParseError(f"malformed reservation line {line[:120]!r}")
        partition = f.get("PartitionName")
        found.append(Reservation(name=f["ReservationName"], state=f["State"],
                                 start=f.get("StartTime", ""), users=_list(f.get("Users")),
                                 accounts=_list(f.get("Accounts")),
                                 partition=None if partition in (None, *NULL) else partition))
    return found


def parse_node_features(text: str) -> Dict[str, Tuple[str, ...]]:
    """Rows of ``sinfo -N -h -o '%N|%f'``: node -> its available features."""
    return {node: _list(features) for node, features in _lines(text, 2, "sinfo feature")}
