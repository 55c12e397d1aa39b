"""The typed Slurm client: every call is an argv list through one runner.

Errors say what is known: SchedulerRejected (Slurm answered no: nothing happened),
SchedulerUncertain (no or a garbled answer to a command that changes state: it may have
happened), SchedulerUnavailable (a query could not be answered, or the client found no
cluster configuration: nothing happened; retry later). Which stderr means what is decided
once, in ``control.slurm.runner``; every error for an unreachable cluster carries its hint
(``is SLURM_CONF set?`` / ``is slurmctld up?``). A read-only query never says that it
"may have taken effect".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

from synthbatch.agent_stdlib.arrays import is_job_id
from synthbatch.control.errors import (
    InvalidInput,
    SchedulerRejected,
    SchedulerUnavailable,
    SchedulerUncertain,
    SynthbatchError,
)
from synthbatch.control.slurm.parsers import (
    Association,
    JobRow,
    JobUsage,
    NodeShape,
    ParseError,
    Partition,
    PartitionLimits,
    Reservation,
    index_rows,
    parse_associations,
    parse_max_array_size,
    parse_node_features,
    parse_node_shapes,
    parse_partitions,
    parse_qos_names,
    parse_reservations,
    parse_sacct,
    parse_sacct_usage,
    parse_sbatch_id,
    parse_sinfo,
    parse_squeue,
    parse_usage,
)
from synthbatch.control.slurm.runner import (
    CommandResult,
    CommandTimeout,
    Runner,
    binary,
    controller_hint,
    run_command,
)

ACCOUNTING_DISABLED = "accounting storage is disabled"
INVALID_JOB_ID = "Invalid job id specified"
ALREADY_DONE = "already completing or completed"
SQUEUE_FORMAT = "%i|%T|%r"
SACCT_FORMAT = "JobID,State,ExitCode"
SINFO_FORMAT = "%P|%a|%D|%t"
NODES_FORMAT = "%N|%c|%m|%G|%T"
USAGE_FORMAT = "JobID,ElapsedRaw,AllocTRES"
BOTH_FORMAT = f"{SACCT_FORMAT},ElapsedRaw,AllocTRES"  # states and usage in one sacct call
NO_PARTITION = "not found"  # scontrol: "Partition NAME not found"
# sacctmgr on a cluster without slurmdbd (AccountingStorageType=accounting_storage/none)
NO_ACCOUNTING = "not running a supported accounting_storage plugin"
ASSOC_FORMAT = "format=Account,Partition,QOS"

T = TypeVar("T")


def array_spec(indices: Sequence[int], throttle: int) -> str:
    """``--array`` value: ranges compressed (``0-9,12``), ``%throttle`` if set."""
    ordered = sorted(set(indices))
    if not ordered:
        raise ValueError("an array needs at least one index")
    parts: List[str] = []
    start = prev = ordered[0]
    for index in ordered[1:] + [None]:  # type: ignore[list-item]
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    spec = ",".join(parts)
    return f"{spec}%{throttle}" if throttle > 0 else spec


def _failure(name: str, result: CommandResult,
             suffix: str = " (it may have taken effect)") -> SynthbatchError:
    """The error of a failed state-changing command, from what its stderr says."""
    message = f"{name} failed: {result.error_line()}"
    if result.no_config:  # the client found no cluster: nothing was sent
        return SchedulerUnavailable(message, hint=result.hint)
    if result.transient:
        return SchedulerUncertain(message + suffix, hint=result.hint)
    return SchedulerRejected(message)


def job_ids_only(job_ids: Sequence[str]) -> List[str]:
    """``job_ids`` as argv words; InvalidInput for one that is not a job id (``12``,
    ``12_3``): such a word read from a damaged record would be an option to Slurm."""
    for job_id in job_ids:
        if not is_job_id(job_id):
            raise InvalidInput(f"not a Slurm job id: {job_id[:40]!r}")
    return list(job_ids)


def run_queue(scheduler: Any, name: str, shared: Sequence[str] = ()
              ) -> Tuple[List[JobRow], Dict[str, JobRow]]:
    """squeue's rows of the jobs called ``name`` (a run's own: one call), and those rows with
    the ``shared`` arrays' (one more call: their tasks have names of their own) by job id."""
    rows = scheduler.queue(name=name)
    return rows, index_rows(rows + (scheduler.queue(job_ids=shared) if shared else []))


def left_queue(queue: Dict[str, JobRow], job_ids: Set[str]) -> Set[str]:
    """The ``job_ids`` squeue (``queue``: ``run_queue``'s index) no longer lists or shows
    ended."""
    return {j for j in job_ids if j not in queue or queue[j].terminal}


@dataclass
class Scheduler:
    """sbatch / scontrol / squeue / sacct / scancel / sinfo for one cluster."""

    slurm_bin: Optional[str] = None
    timeout_s: float = 30.0
    USAGE_FROM: ClassVar[str] = "accounting (sacct)"  # where ``usage`` comes from
    runner: Runner = field(default=run_command)

    def _run(self, name: str, *args: str) -> CommandResult:
        return self.runner([binary(name, self.slurm_bin), *args], self.timeout_s)

    def _checked(self, name: str, *args: str) -> CommandResult:
        """Run a state-changing command: a refusal is definite, a busy cluster is not."""
        result = self._run(name, *args)
        if result.returncode != 0:
            raise _failure(name, result)
        return result

    def _ask(self, name: str, *args: str) -> CommandResult:
        """Run a read-only command; a timeout is SchedulerUnavailable (nothing can change)."""
        try:
            return self._run(name, *args)
        except CommandTimeout as err:
            raise SchedulerUnavailable(f"{name}: no answer within {self.timeout_s:g}s",
                                       hint=controller_hint()) from err

    def query(self, name: str, *args: str) -> CommandResult:
        """Run a read-only command; any failure but "Invalid job id" is SchedulerUnavailable."""
        result = self._ask(name, *args)
        if result.returncode != 0 and INVALID_JOB_ID not in result.stderr:
            raise SchedulerUnavailable(f"{name} failed: {result.error_line()}",
                                       hint=result.hint)
        return result

    def submit_held_array(self, script: str, indices: Sequence[int], throttle: int,
                          job_name: str) -> tuple[str, List[str]]:
        """``sbatch --parsable --hold --array=...``; return the job id and the argv used.

        Raises SchedulerUncertain when a job may exist although no id came back.
        """
        argv = ["--parsable", "--hold", f"--array={array_spec(indices, throttle)}",
                f"--job-name={job_name}", script]
        result = self._checked("sbatch", *argv)
        try:
            return parse_sbatch_id(result.stdout), [binary("sbatch", self.slurm_bin), *argv]
        except ParseError as err:
            raise SchedulerUncertain(f"{err} (the job may exist)") from err

    def submit_job(self, argv: Sequence[str]) -> str:
        """``sbatch ARGV`` (with ``--parsable``) of one plain job; return its job id."""
        result = self._checked("sbatch", *argv)
        try:
            return parse_sbatch_id(result.stdout)
        except ParseError as err:
            raise SchedulerUncertain(f"{err} (the job may exist)") from err

    def release(self, job_id: str) -> None:
        """``scontrol release JOB`` (all tasks of an array)."""
        self._checked("scontrol", "release", *job_ids_only([job_id]))

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` the given jobs; ids that are unknown or already ended are fine."""
        if not job_ids:
            return
        result = self._run("scancel", *job_ids_only(job_ids))
        if result.returncode == 0:
            return
        errors = [line for line in result.stderr.splitlines()
                  if line.strip() and INVALID_JOB_ID not in line and ALREADY_DONE not in line]
        if errors:
            raise _failure("scancel", result, suffix="")

    def jobs_named(self, job_name: str) -> List[JobRow]:
        """Queued or running jobs called ``job_name`` (finds unrecorded submissions)."""
        result = self.query("squeue", "-h", "-n", job_name, "-o", SQUEUE_FORMAT)
        return self._parse(parse_squeue, result)

    def queue(self, job_ids: Sequence[str] = (), name: Optional[str] = None) -> List[JobRow]:
        """One ``squeue -t all`` call for ``job_ids`` and/or jobs called ``name``.

        Pending array tasks stay one compact row (``12_[4-9%2]``); ``-t all`` keeps jobs
        that ended less than MinJobAge ago; unknown ids are simply absent.
        """
        if not job_ids and not name:
            return []
        args = ["-h", "-t", "all"]
        if job_ids:
            args += ["-j", ",".join(job_ids_only(job_ids))]
        if name:
            args += ["-n", name]
        result = self.query("squeue", *args, "-o", SQUEUE_FORMAT)
        return self._parse(parse_squeue, result)

    def accounting(self, job_ids: Sequence[str]) -> Optional[List[JobRow]]:
        """One ``sacct`` call for ``job_ids``; None when the cluster keeps no accounting."""
        if not job_ids:
            return []
        result = self._sacct("-X", "-j", ",".join(job_ids_only(job_ids)),
                             f"--format={SACCT_FORMAT}")
        return None if result is None else self._parse(parse_sacct, result)

    def _sacct(self, *args: str) -> Optional[CommandResult]:
        """``sacct -n -P ARGS``; None when the cluster keeps no accounting."""
        return self._accounting("sacct", ACCOUNTING_DISABLED, *args)

    def _accounting(self, name: str, disabled: str, *args: str) -> Optional[CommandResult]:
        """``NAME -n -P ARGS`` of the accounting (sacct, sacctmgr); None when the cluster
        keeps none (its output says ``disabled``)."""
        result = self._ask(name, "-n", "-P", *args)
        if result.returncode != 0:
            if disabled in result.stderr + result.stdout:
                return None
            raise SchedulerUnavailable(f"{name} failed: {result.error_line()}",
                                       hint=result.hint)
        return result

    def max_array_size(self) -> Optional[int]:
        """``MaxArraySize`` from ``scontrol show config`` (None if Slurm does not say)."""
        return parse_max_array_size(self.query("scontrol", "show", "config").stdout)

    def partitions(self) -> List[Partition]:
        """``sinfo``: partitions, their availability and node states."""
        return self._parse(parse_sinfo, self.query("sinfo", "-h", "-o", SINFO_FORMAT))

    def partition_limits(self, name: Optional[str]) -> Optional[PartitionLimits]:
        """``scontrol show partition -o``: the partition called ``name`` (None: the
        default one); None when there is no such partition."""
        args = ["show", "partition", "-o"] + ([name] if name else [])
        result = self._ask("scontrol", *args)
        if result.returncode != 0:
            if name and NO_PARTITION in result.stderr + result.stdout:
                return None
            raise SchedulerUnavailable(f"scontrol failed: {result.error_line()}",
                                       hint=result.hint)
        rows = self._parse(parse_partitions, result)
        return next((p for p in rows if (p.name == name if name else p.default)), None)

    def partition_nodes(self, name: str) -> List[NodeShape]:
        """``sinfo -N -p NAME``: every node of the partition, its CPUs, memory and GPUs."""
        result = self.query("sinfo", "-N", "-h", "-p", name, "-o", NODES_FORMAT)
        return self._parse(parse_node_shapes, result)

    def node_features(self, name: str) -> Dict[str, Tuple[str, ...]]:
        """``sinfo -N -p NAME -o '%N|%f'``: every node of the partition and its features."""
        result = self.query("sinfo", "-N", "-h", "-p", name, "-o", "%N|%f")
        return self._parse(parse_node_features, result)

    def reservations(self) -> List[Reservation]:
        """``scontrol show reservation -o``: every reservation of the cluster."""
        return self._parse(parse_reservations,
                           self.query("scontrol", "show", "reservation", "-o"))

    def associations(self, user: str) -> Optional[List[Association]]:
        """The accounting's associations of ``user`` (account, partition, QOS); None when
        the cluster keeps no accounting."""
        result = self._accounting("sacctmgr", NO_ACCOUNTING, "show", "assoc", "where",
                                  f"user={user}", ASSOC_FORMAT)
        return None if result is None else self._parse(parse_associations, result)

    def qos_names(self) -> Optional[List[str]]:
        """Every QOS the accounting knows; None when the cluster keeps no accounting."""
        result = self._accounting("sacctmgr", NO_ACCOUNTING, "show", "qos",
                                  "format=Name")
        return None if result is None else self._parse(parse_qos_names, result)

    def usage(self, job_ids: Sequence[str]) -> Optional[List[JobUsage]]:
        """Elapsed seconds and GPUs of every execution of ``job_ids`` (requeues included:
        ``sacct -D``); None when the cluster keeps no accounting."""
        if not job_ids:
            return []
        result = self._sacct("-X", "-D", "-j", ",".join(job_ids_only(job_ids)),
                             f"--format={USAGE_FORMAT}")
        return None if result is None else self._parse(parse_usage, result)

    def accounting_usage(self, state_ids: Sequence[str], usage_ids: Sequence[str]
                         ) -> Optional[Tuple[List[JobRow], List[JobUsage]]]:
        """``accounting(state_ids)`` and ``usage(usage_ids)`` in ONE ``sacct -D`` call (a
        status refresh of a running run needs both); the rows are those of every job
        asked (the caller keeps its own); None when the cluster keeps no accounting."""
        ids = sorted(set(job_ids_only(state_ids)) | set(job_ids_only(usage_ids)))
        if not ids:
            return [], []
        result = self._sacct("-X", "-D", "-j", ",".join(ids), f"--format={BOTH_FORMAT}")
        return None if result is None else self._parse(parse_sacct_usage, result)

    def describe(self, job_name: str) -> Dict[str, Any]:
        """``status``'s ``backend``: this is Slurm (no call is made)."""
        return {"name": "slurm"}

    @staticmethod
    def _parse(parser: Callable[[str], T], result: CommandResult) -> T:
        try:
            return parser(result.stdout)
        except ParseError as err:
            raise SchedulerUnavailable(f"{result.describe()}: {err}") from err
