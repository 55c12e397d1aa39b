"""The Slurm client with a fake runner, and the one real command runner."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import List, Sequence

import pytest

from synthbatch.control.errors import SchedulerRejected, SchedulerUnavailable, SchedulerUncertain
from synthbatch.control.slurm.parsers import JobRow
from synthbatch.control.slurm.runner import CommandResult, CommandTimeout, binary, run_command
from synthbatch.control.slurm.scheduler import (
    ACCOUNTING_DISABLED,
    SQUEUE_FORMAT,
    Scheduler,
    array_spec,
)
from tests.fakes import FakeSlurm, Reply

# ----------------------------------------------------------------------------- array_spec


@pytest.mark.parametrize("indices,throttle,expected", [
    (range(10), 0, "0-9"),
    ([0, 1, 2, 5, 7, 8], 0, "0-2,5,7-8"),
    (range(10), 4, "0-9%4"),
    ([8, 7, 0, 2, 1, 5, 5, 2], 0, "0-2,5,7-8"),
    ([3], 0, "3"),
    ([3], 2, "3%2"),
    ([1, 3, 5], 0, "1,3,5"),
    ([0, 1], 0, "0-1"),
    ([9, 9, 9], 0, "9"),
    ([4000, 3999, 12], 1, "12,3999-4000%1"),
])
def test_array_spec(indices: Sequence[int], throttle: int, expected: str) -> None:
    assert array_spec(list(indices), throttle) == expected


def expand(spec: str) -> List[int]:
    out: List[int] = []
    for part in spec.split("%")[0].split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def test_array_spec_round_trips() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        indices = [rng.randrange(60) for _ in range(rng.randint(1, 40))]
        spec = array_spec(indices, 0)
        assert expand(spec) == sorted(set(indices))
        assert "--" not in spec and not spec.endswith(",")


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def sched(fake: FakeSlurm) -> Scheduler:
    return Scheduler(runner=fake)


def test_fake_rejects_unexpected_flags(fake: FakeSlurm) -> None:
    fake.on("squeue")
    with pytest.raises(pytest.fail.Exception, match="unexpected flag"):
        fake(["squeue", "--all"], 30.0)
    with pytest.raises(pytest.fail.Exception, match="unexpected command"):
        fake(["srun", "true"], 30.0)


# ----------------------------------------------------------------------------- sbatch


def test_submit_held_array(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sbatch", stdout="4242\n")
    job_id, argv = sched.submit_held_array("/runs/r/submissions/0001.sbatch", [2, 0, 1, 5], 3,
                                           "synthbatch-r")
    expected = ["sbatch", "--parsable", "--hold", "--array=0-2,5%3",
                "--job-name=synthbatch-r", "/runs/r/submissions/0001.sbatch"]
    assert job_id == "4242"
    assert fake.only_call() == expected
    assert argv == expected


def test_submit_with_cluster_suffix(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sbatch", stdout="77;west\n")
    assert sched.submit_held_array("/s", [0], 0, "n")[0] == "77"
    assert fake.only_call()[3] == "--array=0"


def test_submit_rejected(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sbatch", code=1, stderr="\nsbatch: error: Batch job submission failed: "
                                     "Invalid account or account/partition combination\n")
    with pytest.raises(SchedulerRejected) as info:
        sched.submit_held_array("/s", [0, 1], 0, "n")
    assert info.value.message == ("sbatch failed: sbatch: error: Batch job submission failed: "
                                  "Invalid account or account/partition combination")
    assert info.value.exit_code == 2


def test_submit_rejected_without_stderr(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sbatch", code=1)
    with pytest.raises(SchedulerRejected, match="exit status 1"):
        sched.submit_held_array("/s", [0], 0, "n")


@pytest.mark.parametrize("stdout", ["", "Submitted batch job 5\n", f"{2**32}\n"])
def test_submit_unparsable_id(fake: FakeSlurm, sched: Scheduler, stdout: str) -> None:
    fake.on("sbatch", stdout=stdout)
    # sbatch exited 0, so a job may exist: uncertain, never "rejected"
    with pytest.raises(SchedulerUncertain, match="not a job id.*may exist"):
        sched.submit_held_array("/s", [0], 0, "n")


@pytest.mark.parametrize("stderr", [
    "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n",
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller\n",
])
def test_submit_transient_failure_is_uncertain(fake: FakeSlurm, sched: Scheduler,
                                               stderr: str) -> None:
    fake.on("sbatch", code=1, stderr=stderr)
    with pytest.raises(SchedulerUncertain, match="may have taken effect") as info:
        sched.submit_held_array("/s", [0], 0, "n")
    assert not isinstance(info.value, SchedulerRejected) and info.value.exit_code == 5


def test_submit_timeout_propagates(sched: Scheduler, fake: FakeSlurm) -> None:
    def boom(args: List[str]) -> Reply:
        raise CommandTimeout("sbatch: no answer within 30s (it may have taken effect)")

    fake.replies["sbatch"] = boom
    with pytest.raises(CommandTimeout):
        sched.submit_held_array("/s", [0], 0, "n")


# ----------------------------------------------------------------------------- scontrol / scancel


def test_release(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scontrol")
    sched.release("4242")
    assert fake.only_call() == ["scontrol", "release", "4242"]


def test_release_rejected(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scontrol", code=1, stderr="slurm_release_job error: Invalid job id specified\n")
    with pytest.raises(SchedulerRejected, match="scontrol failed: slurm_release_job error"):
        sched.release("4242")


def test_cancel(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scancel")
    sched.cancel(["10_1", "11"])
    assert fake.only_call() == ["scancel", "10_1", "11"]


def test_cancel_nothing_runs_nothing(fake: FakeSlurm, sched: Scheduler) -> None:
    sched.cancel([])
    assert fake.calls == []


def test_cancel_invalid_job_id_tolerated(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scancel", code=1, stderr="scancel: error: Kill job error on job id 99: "
                                      "Invalid job id specified\n")
    sched.cancel(["99"])


def test_cancel_already_completed_tolerated(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scancel", code=1, stderr="scancel: error: Kill job error on job id 5: "
                                      "Job/step already completing or completed\n")
    sched.cancel(["5"])


def test_cancel_transient_error_is_uncertain(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scancel", code=1, stderr="scancel: error: Unable to contact slurm controller\n")
    with pytest.raises(SchedulerUncertain):
        sched.cancel(["5"])


def test_release_transient_error_is_uncertain(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scontrol", code=1, stderr="slurm_release_job error: Socket timed out on "
                                       "send/recv operation\n")
    with pytest.raises(SchedulerUncertain):
        sched.release("9")


def test_cancel_other_error(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("scancel", code=1, stderr="scancel: error: Access/permission denied\n")
    with pytest.raises(SchedulerRejected, match="permission denied"):
        sched.cancel(["99"])


# ----------------------------------------------------------------------------- squeue


def test_queue_by_name(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("squeue", stdout="12_3|RUNNING|None\n12_[4-9%2]|PENDING|JobArrayTaskLimit\n")
    rows = sched.queue(name="synthbatch-r")
    assert fake.only_call() == ["squeue", "-h", "-t", "all", "-n", "synthbatch-r", "-o",
                                SQUEUE_FORMAT]
    assert rows == [JobRow("12_3", "RUNNING"), JobRow("12_[4-9%2]", "PENDING",
                                                      "JobArrayTaskLimit")]


def test_queue_by_ids(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("squeue", stdout="15|COMPLETED|None\n")
    assert sched.queue(["12", "15"])[0].state == "COMPLETED"
    assert fake.only_call() == ["squeue", "-h", "-t", "all", "-j", "12,15", "-o",
                                SQUEUE_FORMAT]


def test_queue_nothing_asked(fake: FakeSlurm, sched: Scheduler) -> None:
    assert sched.queue([]) == []
    assert fake.calls == []


def test_queue_invalid_job_id_means_gone(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("squeue", code=1, stderr="slurm_load_jobs error: Invalid job id specified\n")
    assert sched.queue(["12"]) == []


def test_queue_unavailable(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("squeue", code=1, stderr="slurm_load_jobs error: Unable to contact slurm "
                                     "controller (connect failure)\n")
    with pytest.raises(SchedulerUnavailable, match="squeue failed: .*Unable to contact"):
        sched.queue(["12"])


def test_queue_garbage_is_unavailable(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("squeue", stdout="this is not squeue output\n")
    with pytest.raises(SchedulerUnavailable) as info:
        sched.queue(["12"])
    assert not isinstance(info.value, SchedulerRejected)
    assert "malformed squeue line" in info.value.message
    assert info.value.message.startswith("squeue -h -t all -j 12 -o '%i|%T|%r': ")


def test_jobs_named(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("squeue", stdout="31_[0-3]|PENDING|JobHeldUser\n30|RUNNING|None\n")
    rows = sched.jobs_named("synthbatch-r")
    assert [r.job_id for r in rows] == ["31_[0-3]", "30"]
    assert fake.only_call() == ["squeue", "-h", "-n", "synthbatch-r", "-o", SQUEUE_FORMAT]


def test_partitions(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sinfo", stdout="debug*|up|1|mix\ngpu|down|4|down\n")
    parts = sched.partitions()
    assert fake.only_call() == ["sinfo", "-h", "-o", "%P|%a|%D|%t"]
    assert [(p.name, p.default, p.available, p.nodes) for p in parts] == [
        ("debug", True, True, 1), ("gpu", False, False, 4)]


# ----------------------------------------------------------------------------- sacct


def test_accounting(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sacct", stdout="12_0|COMPLETED|0:0\n12_1|CANCELLED by 0|0:15\n")
    rows = sched.accounting(["12"])
    assert fake.only_call() == ["sacct", "-n", "-P", "-X", "-j", "12",
                                "--format=JobID,State,ExitCode"]
    assert rows is not None
    assert rows[1] == JobRow("12_1", "CANCELLED", "by 0", 0, 15)


def test_accounting_batches_ids(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sacct")
    assert sched.accounting(["1", "2", "3"]) == []
    assert fake.only_call()[5] == "1,2,3"


def test_accounting_empty_ids(fake: FakeSlurm, sched: Scheduler) -> None:
    assert sched.accounting([]) == []
    assert fake.calls == []


def test_accounting_disabled(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sacct", code=1, stderr="sacct: error: Slurm accounting storage is disabled\n")
    assert ACCOUNTING_DISABLED in "Slurm accounting storage is disabled"
    assert sched.accounting(["12"]) is None


def test_accounting_unavailable(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sacct", code=1, stderr="sacct: error: Problem talking to the database: "
                                    "Connection refused\n")
    with pytest.raises(SchedulerUnavailable, match="sacct failed: .*Connection refused"):
        sched.accounting(["12"])


def test_accounting_malformed(fake: FakeSlurm, sched: Scheduler) -> None:
    fake.on("sacct", stdout="12|FAILED|zz\n")
    with pytest.raises(SchedulerUnavailable, match="malformed exit code"):
        sched.accounting(["12"])


# ----------------------------------------------------------------------------- configuration


def test_slurm_bin_prefix() -> None:
    fake = FakeSlurm(timeout_s=7.5, prefix="/opt/slurm/bin/")
    for name, stdout in (("sbatch", "5\n"), ("scontrol", ""), ("squeue", ""), ("sacct", ""),
                         ("scancel", "")):
        fake.on(name, stdout=stdout)
    sched = Scheduler(slurm_bin="/opt/slurm/bin", timeout_s=7.5, runner=fake)
    job_id, argv = sched.submit_held_array("/s", [0], 0, "n")
    assert argv[0] == "/opt/slurm/bin/sbatch"
    sched.release(job_id)
    sched.queue([job_id])
    sched.accounting([job_id])
    sched.cancel([job_id])
    assert [c[0] for c in fake.calls] == [f"/opt/slurm/bin/{n}" for n in
                                          ("sbatch", "scontrol", "squeue", "sacct", "scancel")]


def test_binary() -> None:
    assert binary("sbatch", None) == "sbatch"
    assert binary("sbatch", "/opt/slurm/bin") == "/opt/slurm/bin/sbatch"


# ----------------------------------------------------------------------------- run_command


def test_run_command_captures_output() -> None:
    result = run_command([sys.executable, "-c",
                          "import sys; print('out'); print('err', file=sys.stderr); "
                          "sys.exit(3)"], 10)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.error_line() == "err"


def test_run_command_sets_lc_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    result = run_command(["env"], 10)
    assert result.returncode == 0
    assert "LC_ALL=C" in result.stdout.splitlines()


def test_run_command_drops_what_would_override_the_scripts_export(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # sbatch reads SBATCH_EXPORT over the script's #SBATCH --export allow-list
    monkeypatch.setenv("SBATCH_EXPORT", "ALL")
    result = run_command(["sh", "-c", 'echo "${SBATCH_EXPORT-unset} $LC_ALL"'], 5.0)
    assert result.stdout == "unset C\n"


def test_run_command_no_stdin() -> None:
    result = run_command([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], 10)
    assert result.stdout == "''\n"


def test_run_command_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(SchedulerUnavailable) as info:
        run_command([str(tmp_path / "sbatch"), "--parsable"], 5)
    assert not isinstance(info.value, CommandTimeout)
    assert "command not found" in info.value.message
    assert str(tmp_path / "sbatch") in info.value.message
    assert info.value.hint and "slurm_bin" in info.value.hint
    assert info.value.exit_code == 5


def test_run_command_not_executable(tmp_path: Path) -> None:
    path = tmp_path / "sbatch"
    path.write_text("#!/bin/sh\necho 1\n")
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    if os.access(path, os.X_OK):  # pragma: no cover - running as root with odd mounts
        pytest.skip("file is executable anyway")
    with pytest.raises(SchedulerUnavailable):
        run_command([str(path)], 5)


def test_run_command_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        run_command(["sleep", "5"], 0.3)
    assert time.monotonic() - start < 3
    assert isinstance(info.value, SchedulerUnavailable)
    assert "sleep 5: no answer within 0.3s" in info.value.message
    assert "may have taken effect" in info.value.message


def test_command_result_describe() -> None:
    result = CommandResult(argv=["squeue", "-o", "%i|%T"], returncode=0, stdout="", stderr="")
    assert result.describe() == "squeue -o '%i|%T'"
    assert result.error_line() == "exit status 0"


def test_error_line_is_bounded() -> None:
    result = CommandResult(argv=["x"], returncode=1, stdout="", stderr="  \n" + "e" * 1000)
    assert result.error_line() == "e" * 299 + "…"


def test_describe_redacts_secrets() -> None:
    result = CommandResult(argv=["srun", "serve", "--api-key", "s3cret",
                                 "http://user:pw@host/x"], returncode=1, stdout="",
                           stderr="boom Bearer abc.def\n")
    assert "s3cret" not in result.describe() and "pw@" not in result.describe()
    assert result.error_line() == "boom Bearer ***"


def test_default_runner_is_run_command() -> None:
    assert Scheduler().runner is run_command


# ----------------------------------------------------------------------------- unreachable
# stderr recorded from Slurm 22.05 clients (see control/slurm/runner.py)

NO_CONFIG_STDERR = (
    "squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "squeue: error: fetch_config: DNS SRV lookup failed\n"
    "squeue: error: _establish_config_source: failed to fetch config\n"
    "squeue: fatal: Could not establish a configuration source\n")
DOWN_STDERR = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"


def test_no_configuration_is_unavailable_with_the_fatal_line_and_hint(
        fake: FakeSlurm, sched: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    fake.on("squeue", code=1, stderr=NO_CONFIG_STDERR)
    with pytest.raises(SchedulerUnavailable) as info:
        sched.queue(name="synthbatch-r")
    assert info.value.message == ("squeue failed: squeue: fatal: Could not establish a "
                                  "configuration source")
    assert info.value.hint.startswith("is SLURM_CONF set? (it is not set")
    assert info.value.exit_code == 5


@pytest.mark.parametrize("name,call", [
    ("scancel", lambda s: s.cancel(["5"])),
    ("scontrol", lambda s: s.release("5")),
    ("sbatch", lambda s: s.submit_held_array("/s", [0], 0, "n")),
])
def test_no_configuration_of_a_state_changing_command_is_definite_and_unavailable(
        fake: FakeSlurm, sched: Scheduler, name: str, call) -> None:
    fake.on(name, code=1, stderr=NO_CONFIG_STDERR.replace("squeue", name))
    with pytest.raises(SchedulerUnavailable) as info:
        call(sched)
    assert type(info.value) is SchedulerUnavailable  # not uncertain: nothing was sent
    assert info.value.exit_code == 5 and "may have taken effect" not in info.value.message
    assert "is SLURM_CONF set?" in info.value.hint


def test_controller_down_hint(fake: FakeSlurm, sched: Scheduler,
                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    fake.on("squeue", code=1, stderr=DOWN_STDERR)
    with pytest.raises(SchedulerUnavailable) as info:
        sched.queue(["12"])
    assert info.value.hint == "is slurmctld up?"
    fake.on("scancel", code=1, stderr="scancel: error: Kill job error on job id 5: Unable to "
                                      "contact slurm controller (connect failure)\n")
    with pytest.raises(SchedulerUncertain) as cancelled:
        sched.cancel(["5"])
    assert cancelled.value.hint == "is slurmctld up?"


def test_a_query_that_times_out_never_says_it_may_have_taken_effect(fake: FakeSlurm,
                                                                    sched: Scheduler) -> None:
    def slow(args: List[str]) -> Reply:
        raise CommandTimeout("squeue: no answer within 30s (it may have taken effect)")

    for name, call in (("squeue", lambda: sched.queue(["1"])),
                       ("sacct", lambda: sched.accounting(["1"])),
                       ("sinfo", sched.partitions)):
        fake.replies[name] = slow
        with pytest.raises(SchedulerUnavailable) as info:
            call()
        assert not isinstance(info.value, SchedulerUncertain)
        assert info.value.message == f"{name}: no answer within 30s"
        assert "may have taken effect" not in info.value.message + (info.value.hint or "")


def test_a_slurm_conf_naming_a_missing_file_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The clients would retry for 60 s before failing; no client is started at all.
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nowhere.conf"))
    monkeypatch.setenv("PATH", str(tmp_path))  # a started client would be "not found"
    with pytest.raises(SchedulerUnavailable) as info:
        run_command(["squeue", "-h"], 30)
    assert info.value.message == f"squeue: SLURM_CONF={tmp_path / 'nowhere.conf'}: no such file"
    assert info.value.hint == (f"is SLURM_CONF set? (it names {tmp_path / 'nowhere.conf'}, "
                               "which does not exist)")
    assert run_command([sys.executable, "-c", "print(1)"], 10).stdout == "1\n"  # not Slurm


def test_error_line_prefers_the_fatal_line() -> None:
    result = CommandResult(["sinfo"], 1, "", NO_CONFIG_STDERR.replace("squeue", "sinfo"))
    assert result.error_line() == "sinfo: fatal: Could not establish a configuration source"
    assert result.no_config and result.transient is False
