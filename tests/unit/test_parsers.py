"""Pure Slurm output parsers, on literal strings captured from Slurm 22.05."""

from __future__ import annotations

import random

import pytest

from control.slurm.parsers import (
    MAX_JOB_ID,
    JobRow,
    ParseError,
    parse_sacct,
    parse_sbatch_id,
    parse_squeue,
)

# ----------------------------------------------------------------------------- sbatch


@pytest.mark.parametrize("stdout,job_id", [
    ("123\n", "123"),
    ("123", "123"),
    ("  42  \n", "42"),
    ("123;cluster\n", "123"),
    ("77;my-cluster_2.a\n", "77"),
    (f"{MAX_JOB_ID}\n", str(MAX_JOB_ID)),
    ("0\n", "0"),
])
def test_sbatch_ids(stdout: str, job_id: str) -> None:
    assert parse_sbatch_id(stdout) == job_id


@pytest.mark.parametrize("stdout", [
    "",
    "\n",
    "Submitted batch job 123\n",
    "sbatch: error: Batch job submission failed: Invalid account\n",
    "12a\n",
    "-5\n",
    "123;\n",
    "123;clu ster\n",
    "123\n456\n",
    "sbatch: warning: something\n123\n",
    f"{MAX_JOB_ID + 1}\n",  # > 32 bit
    "99999999999\n",  # 11 digits
    "1" * 200,
])
def test_sbatch_garbage(stdout: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_sbatch_id(stdout)
    assert "not a job id" in str(info.value)
    assert len(str(info.value)) < 200


def test_parse_error_is_a_value_error() -> None:
    assert issubclass(ParseError, ValueError)


# ----------------------------------------------------------------------------- squeue

# `squeue -h -r -o '%i|%T|%r'` on the testbed (see slurm-testbed/samples/squeue-scontrol.txt)
SQUEUE = """\
8_[2-5%2]|PENDING|JobArrayTaskLimit
10|PENDING|Dependency
6|PENDING|JobHeldUser
8_0|RUNNING|None
8_1|RUNNING|None
9|RUNNING|None
"""


def test_squeue_rows() -> None:
    rows = parse_squeue(SQUEUE)
    assert list(rows) == ["8_[2-5%2]", "10", "6", "8_0", "8_1", "9"]
    assert rows["8_[2-5%2]"] == JobRow("8_[2-5%2]", "PENDING", "JobArrayTaskLimit")
    assert rows["6"].reason == "JobHeldUser"
    assert rows["8_0"].state == "RUNNING"
    assert rows["8_0"].exit_code is None and rows["8_0"].signal is None


def test_squeue_array_tasks_and_pending_range() -> None:
    rows = parse_squeue("12_3|RUNNING|None\n12_[4-9%2]|PENDING|JobArrayTaskLimit\n")
    assert rows["12_3"].state == "RUNNING"
    assert rows["12_[4-9%2]"] == JobRow("12_[4-9%2]", "PENDING", "JobArrayTaskLimit")


def test_squeue_empty_reason_is_none() -> None:
    assert parse_squeue("5|COMPLETING|\n")["5"].reason is None


def test_squeue_states_with_underscores() -> None:
    rows = parse_squeue("5|REQUEUE_HOLD|JobHeldAdmin\n6|STAGE_OUT|None\n")
    assert rows["5"].state == "REQUEUE_HOLD" and rows["6"].state == "STAGE_OUT"


def test_squeue_empty_and_blank_lines() -> None:
    assert parse_squeue("") == {}
    assert parse_squeue("\n  \n") == {}
    assert list(parse_squeue("\n1|RUNNING|None\n\n")) == ["1"]


@pytest.mark.parametrize("line", [
    "8_0 RUNNING",
    "8_0|RUNNING",
    "8_0|RUNNING|None|extra",
    "|RUNNING|None",
    "8_0|running|None",
    "8_0||None",
    "squeue: error: Invalid job id specified",
    "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
])
def test_squeue_malformed(line: str) -> None:
    with pytest.raises(ParseError, match="malformed squeue line"):
        parse_squeue(f"1|RUNNING|None\n{line}\n")


# ----------------------------------------------------------------------------- sacct

# `sacct -n -P -X -j ... --format=JobID,State,ExitCode`
SACCT = """\
1|FAILED|3:0
2_0|RUNNING|0:0
2_1|COMPLETED|0:0
2_[2-3%2]|PENDING|0:0
3|CANCELLED by 0|0:15
4_0|NODE_FAIL|0:0
4_1|OUT_OF_MEMORY|0:125
4_2|TIMEOUT|0:0
4_3|PREEMPTED|0:0
5|FAILED|0:9
"""


def test_sacct_rows() -> None:
    rows = parse_sacct(SACCT)
    assert len(rows) == 10
    assert rows["1"] == JobRow("1", "FAILED", None, 3, 0)
    assert rows["2_0"] == JobRow("2_0", "RUNNING", None, 0, 0)
    assert rows["2_[2-3%2]"].state == "PENDING"
    assert rows["3"] == JobRow("3", "CANCELLED", "by 0", 0, 15)
    assert rows["4_0"].state == "NODE_FAIL"
    assert (rows["4_1"].state, rows["4_1"].signal) == ("OUT_OF_MEMORY", 125)
    assert rows["4_2"].state == "TIMEOUT"
    assert rows["4_3"].state == "PREEMPTED"
    assert (rows["5"].exit_code, rows["5"].signal) == (0, 9)


def test_sacct_cancelled_by_uid() -> None:
    row = parse_sacct("7_2|CANCELLED by 1000|0:0\n")["7_2"]
    assert (row.state, row.reason) == ("CANCELLED", "by 1000")


def test_sacct_last_row_wins() -> None:
    rows = parse_sacct("9|PREEMPTED|0:0\n9|REQUEUED|0:0\n9|RUNNING|0:0\n")
    assert rows["9"].state == "RUNNING"


def test_sacct_step_rows_are_kept_apart() -> None:
    rows = parse_sacct("1|FAILED|3:0\n1.batch|FAILED|3:0\n1.0|COMPLETED|0:0\n")
    assert rows["1"].exit_code == 3
    assert rows["1.0"].state == "COMPLETED"


def test_sacct_empty_exit_code() -> None:
    row = parse_sacct("1|PENDING|\n")["1"]
    assert row.exit_code is None and row.signal is None


def test_sacct_blank() -> None:
    assert parse_sacct("") == {}
    assert parse_sacct("\n\n") == {}


@pytest.mark.parametrize("line", [
    "1|FAILED",
    "1|FAILED|3:0|extra",
    "|FAILED|3:0",
    "1||3:0",
    "1|FAILED|3",
    "1|FAILED|3:0:1",
    "1|FAILED|x:0",
    "1|FAILED|-1:0",
    "1|FAILED|:",
    "JobID JobName State",
    "sacct: error: Slurm accounting storage is disabled",
])
def test_sacct_malformed(line: str) -> None:
    with pytest.raises(ParseError):
        parse_sacct(f"1|RUNNING|0:0\n{line}\n")


# ----------------------------------------------------------------------------- robustness


def test_parsers_only_raise_parse_error_on_garbage() -> None:
    rng = random.Random(1234)
    alphabet = "0123456789|:_[]%-;. aAZ\tby\n"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for parser in (parse_sbatch_id, parse_squeue, parse_sacct):
            try:
                parser(text)
            except ParseError:
                pass


def test_sacct_non_ascii_digit_exit_code_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_sacct("1|FAILED|\u00b2:0\n")


def test_sbatch_non_ascii_digits_rejected() -> None:
    with pytest.raises(ParseError):
        parse_sbatch_id("\u0661\u0662\u0663\n")
