"""The typed Slurm client: every call is an argv list through one runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from control.errors import SchedulerRejected, SchedulerUnavailable
from control.slurm.parsers import JobRow, ParseError, parse_sacct, parse_sbatch_id, parse_squeue
from control.slurm.runner import CommandResult, CommandTimeout, Runner, binary, run_command

ACCOUNTING_DISABLED = "accounting storage is disabled"


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


@dataclass
class Scheduler:
    """sbatch / scontrol / squeue / sacct / scancel for one cluster."""

    slurm_bin: Optional[str] = None
    timeout_s: float = 30.0
    runner: Runner = field(default=run_command)

    def _run(self, name: str, *args: str) -> CommandResult:
        return self.runner([binary(name, self.slurm_bin), *args], self.timeout_s)

    def _checked(self, name: str, *args: str) -> CommandResult:
        result = self._run(name, *args)
        if result.returncode != 0:
            raise SchedulerRejected(f"{name} failed: {result.error_line()}")
        return result

    def submit_held_array(self, script: str, indices: Sequence[int], throttle: int,
                          job_name: str) -> tuple[str, List[str]]:
        """``sbatch --parsable --hold --array=...``; return the job id and the argv used."""
        argv = ["--parsable", "--hold", f"--array={array_spec(indices, throttle)}",
                f"--job-name={job_name}", script]
        result = self._checked("sbatch", *argv)
        try:
            return parse_sbatch_id(result.stdout), [binary("sbatch", self.slurm_bin), *argv]
        except ParseError as err:
            raise CommandTimeout(f"{err} (the job may exist)") from err

    def release(self, job_id: str) -> None:
        """``scontrol release JOB``."""
        self._checked("scontrol", "release", job_id)

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` the given jobs (unknown ids are not an error)."""
        if job_ids:
            result = self._run("scancel", *job_ids)
            if result.returncode != 0 and "Invalid job id" not in result.stderr:
                raise SchedulerRejected(f"scancel failed: {result.error_line()}")

    def jobs_named(self, job_name: str) -> List[str]:
        """Raw job ids of queued jobs with ``job_name`` (finds unrecorded submissions)."""
        result = self._checked("squeue", "-h", "-n", job_name, "-o", "%A")
        return sorted({line.strip() for line in result.stdout.splitlines() if line.strip()})

    def queue(self, job_ids: Sequence[str]) -> Dict[str, JobRow]:
        """One ``squeue`` call for all ``job_ids`` (array tasks expanded)."""
        if not job_ids:
            return {}
        result = self._run("squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T|%r")
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                return {}
            raise SchedulerUnavailable(f"squeue failed: {result.error_line()}")
        return self._parse(parse_squeue, result)

    def accounting(self, job_ids: Sequence[str]) -> Optional[Dict[str, JobRow]]:
        """One ``sacct`` call for all ``job_ids``; None when accounting is disabled."""
        if not job_ids:
            return {}
        result = self._run("sacct", "-n", "-P", "-X", "-j", ",".join(job_ids),
                           "--format=JobID,State,ExitCode")
        if result.returncode != 0:
            if ACCOUNTING_DISABLED in result.stderr:
                return None
            raise SchedulerUnavailable(f"sacct failed: {result.error_line()}")
        return self._parse(parse_sacct, result)

    @staticmethod
    def _parse(parser, result: CommandResult) -> Dict[str, JobRow]:  # type: ignore[no-untyped-def]
        try:
            return parser(result.stdout)
        except ParseError as err:
            raise SchedulerUnavailable(f"{result.describe()}: {err}") from err
