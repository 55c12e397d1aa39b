"""Pure Slurm output parsers, on literal strings captured from Slurm 22.05."""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List, Tuple

import pytest

from synthbatch.control.slurm import parsers
from synthbatch.control.slurm.parsers import (
    MAX_JOB_ID,
    JobRow,
    ParseError,
    parse_sbatch_id,
)
from tests.conftest import REPO


def parse_squeue(text: str) -> dict:
    """Rows by printed job id (the parser itself returns a list)."""
    return {row.job_id: row for row in parsers.parse_squeue(text)}


def parse_sacct(text: str) -> dict:
    """Rows by printed job id, the last row of an id winning."""
    return {row.job_id: row for row in parsers.parse_sacct(text)}

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
        for parser in (parse_sbatch_id, parsers.parse_squeue, parsers.parse_sacct,
                       parsers.parse_sinfo, parsers.split_job_id, parsers.expand_tasks):
            try:
                parser(text)
            except ParseError:
                pass


def test_sacct_non_ascii_digit_exit_code_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_sacct("1|FAILED|\u00b2:0\n")


@pytest.mark.parametrize("spec", ["\u00b2", "1-\u00b2", "1%\u00b2", "\u0661-3"])
def test_array_ranges_with_non_ascii_digits_are_parse_errors(spec: str) -> None:
    # str.isdigit() is true for '\u00b2', which int() refuses (it raised ValueError)
    with pytest.raises(ParseError):
        parsers.expand_tasks(spec)


def test_sbatch_non_ascii_digits_rejected() -> None:
    with pytest.raises(ParseError):
        parse_sbatch_id("\u0661\u0662\u0663\n")


# ----------------------------------------------------------------------------- recorded outputs
# fixtures/slurm/*.json were recorded from the real 22.05 testbed by
# fixtures/slurm/capture.py, with the exact formats the scheduler client uses.

RECORDED = REPO / "fixtures" / "slurm"


def recorded(scenario: str) -> Tuple[Dict[str, str], List[Dict[str, Any]]]:
    data = json.loads((RECORDED / f"{scenario}.json").read_text())
    return data["jobs"], data["calls"]


def outputs(scenario: str, command: str) -> List[Dict[str, Any]]:
    return [c for c in recorded(scenario)[1] if c["argv"][0] == command]


def test_recorded_outputs_all_parse() -> None:
    seen = 0
    for path in sorted(RECORDED.glob("*.json")):
        for call in json.loads(path.read_text())["calls"]:
            if call["rc"] != 0:
                continue
            command = call["argv"][0]
            if command == "squeue":
                parsers.parse_squeue(call["stdout"])
            elif command == "sacct" and "-X" in call["argv"]:
                parsers.parse_sacct(call["stdout"])
            elif command == "sinfo":
                parsers.parse_sinfo(call["stdout"])
            else:
                continue
            seen += 1
    assert seen >= 15


def test_recorded_held_then_throttled_array() -> None:
    jobs, _ = recorded("array-lifecycle")
    job = jobs["array"]
    held, after_release, done, _one = (parsers.parse_squeue(c["stdout"])
                                       for c in outputs("array-lifecycle", "squeue")
                                       if "-t" in c["argv"])
    assert held == [JobRow(f"{job}_[0-5%2]", "PENDING", "JobHeldUser")]
    index = parsers.index_rows(after_release)
    assert sorted(index) == sorted(f"{job}_{i}" for i in range(6))
    assert index[f"{job}_0"].state == index[f"{job}_1"].state == "RUNNING"
    assert index[f"{job}_5"] == JobRow(f"{job}_[2-5%2]", "PENDING", "JobArrayTaskLimit")
    assert {r.state for r in done} == {"COMPLETED"} and len(done) == 6


def test_recorded_accounting_lag_then_rows() -> None:
    jobs, _ = recorded("array-lifecycle")
    first, last = (c["stdout"] for c in outputs("array-lifecycle", "sacct"))
    assert parsers.parse_sacct(first) == []  # just released: accounting has nothing yet
    rows = parsers.index_rows(parsers.parse_sacct(last))
    assert rows[f"{jobs['array']}_3"] == JobRow(f"{jobs['array']}_3", "COMPLETED", None, 0, 0)


def test_recorded_outcomes() -> None:
    jobs, _ = recorded("outcomes")
    sacct = outputs("outcomes", "sacct")
    rows = parsers.index_rows(parsers.parse_sacct(sacct[0]["stdout"]))
    assert rows[jobs["fail3"]] == JobRow(jobs["fail3"], "FAILED", None, 3, 0)
    assert rows[jobs["sig9"]] == JobRow(jobs["sig9"], "FAILED", None, 0, 9)
    assert rows[jobs["scancel_running"]] == JobRow(jobs["scancel_running"], "CANCELLED",
                                                   "by 0", 0, 0)
    assert rows[jobs["scancel_held"]].reason == "by 0"
    queue = parsers.index_rows(parsers.parse_squeue(outputs("outcomes", "squeue")[0]["stdout"]))
    assert queue[jobs["fail3"]] == JobRow(jobs["fail3"], "FAILED", "NonZeroExitCode")
    assert queue[jobs["scancel_held"]] == JobRow(jobs["scancel_held"], "CANCELLED",
                                                 "JobHeldUser")
    assert all(row.terminal for row in queue.values())
    steps = parsers.index_rows(parsers.parse_sacct(sacct[1]["stdout"]))
    assert list(steps) == [jobs["fail3"]]  # 141.batch is a step, not indexed


def test_recorded_requeue_deadline_timeout() -> None:
    jobs, _ = recorded("requeue-deadline")
    rows = parsers.index_rows(parsers.parse_sacct(outputs("requeue-deadline", "sacct")[0]
                                                  ["stdout"]))
    assert rows[jobs["requeued"]].state == "REQUEUED" and not rows[jobs["requeued"]].terminal
    assert rows[jobs["deadline"]] == JobRow(jobs["deadline"], "DEADLINE", None, 1, 0)
    queue = parsers.parse_squeue(outputs("requeue-deadline", "squeue")[-1]["stdout"])
    assert {r.state for r in queue} == {"COMPLETING", "DEADLINE"}
    timeout_jobs, _ = recorded("timeout")
    (row,) = parsers.parse_sacct(outputs("timeout", "sacct")[0]["stdout"])
    assert row == JobRow(timeout_jobs["timeout"], "TIMEOUT", None, 0, 0) and row.terminal
    (queued,) = parsers.parse_squeue(outputs("timeout", "squeue")[0]["stdout"])
    assert queued.reason == "TimeLimit"


def test_recorded_absent_and_sinfo() -> None:
    jobs, calls = recorded("absent")
    unknown, mixed = outputs("absent", "squeue")[:2]
    assert unknown["rc"] == 1 and "Invalid job id specified" in unknown["stderr"]
    assert [r.job_id for r in parsers.parse_squeue(mixed["stdout"])] == [jobs["known"]]
    assert parsers.parse_sacct(outputs("absent", "sacct")[0]["stdout"]) == []
    (sinfo,) = outputs("absent", "sinfo")
    partitions = parsers.parse_sinfo(sinfo["stdout"])
    assert {p.name for p in partitions} == {"debug"}
    assert all(p.default and p.available and p.nodes >= 1 for p in partitions)


def test_recorded_no_accounting() -> None:
    (sacct,) = outputs("no-accounting", "sacct")
    assert sacct["rc"] == 1 and "accounting storage is disabled" in sacct["stderr"]
    (row,) = parsers.parse_squeue(outputs("no-accounting", "squeue")[0]["stdout"])
    assert (row.state, row.reason, row.terminal) == ("FAILED", "NonZeroExitCode", True)


# ----------------------------------------------------------------------------- job ids, states


@pytest.mark.parametrize("job_id,expected", [
    ("12", ("12", None)),
    ("12_3", ("12", (3,))),
    ("12_[4-9%2]", ("12", (4, 5, 6, 7, 8, 9))),
    ("12_[1,3-5]", ("12", (1, 3, 4, 5))),
    ("12_[7]", ("12", (7,))),
    ("12.batch", ("12.batch", None)),
    ("12_3.0", ("12.0", (3,))),
    ("12+1", ("12+1", None)),
    (str(MAX_JOB_ID), (str(MAX_JOB_ID), None)),
])
def test_split_job_id(job_id: str, expected: tuple) -> None:
    assert parsers.split_job_id(job_id) == expected


@pytest.mark.parametrize("job_id", [
    "", "x", "12_", "12_[", "12_[]", "12_[5-3]", "12_[a-b]", "12_[1-2%x]", "_3",
    str(MAX_JOB_ID + 1), "12_[0-99999999]", "12 3", "12__3",
])
def test_split_job_id_malformed(job_id: str) -> None:
    with pytest.raises(ParseError):
        parsers.split_job_id(job_id)


@pytest.mark.parametrize("state", sorted(parsers.KNOWN_STATES))
def test_every_state_parses_in_both_formats(state: str) -> None:
    (row,) = parsers.parse_squeue(f"7_1|{state}|None\n")
    assert row.state == state and row.known
    (acct,) = parsers.parse_sacct(f"7_1|{state}|0:0\n")
    assert acct.terminal == (state in parsers.TERMINAL_STATES)
    assert parsers.ACTIVE_STATES.isdisjoint(parsers.TERMINAL_STATES)


def test_issue_states_are_known_and_terminal() -> None:
    for state in ("NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "BOOT_FAIL",
                  "DEADLINE", "CANCELLED", "FAILED", "COMPLETED"):
        assert state in parsers.TERMINAL_STATES
    assert "REQUEUED" in parsers.ACTIVE_STATES and "PENDING" in parsers.ACTIVE_STATES


def test_unknown_state_is_kept_not_crashed() -> None:
    (row,) = parsers.parse_squeue("5|BRAND_NEW_STATE|None\n")
    assert not row.known and not row.terminal


@pytest.mark.parametrize("line", ["5|CANCELLED by|0:0", "5|CANCELLED by x|0:0",
                                  "5|CANCELLED|0:0:0", "5|cancelled|0:0", "5_[|FAILED|0:0"])
def test_sacct_state_malformed(line: str) -> None:
    with pytest.raises(ParseError):
        parsers.parse_sacct(line + "\n")


def test_index_rows_later_rows_win_and_ranges_expand() -> None:
    rows = parsers.parse_sacct("9|PREEMPTED|0:0\n9|PENDING|0:0\n"
                               "3_[0-2]|PENDING|\n3_1|RUNNING|0:0\n")
    index = parsers.index_rows(rows)
    assert index["9"].state == "PENDING"
    assert index["3_0"].state == "PENDING" and index["3_1"].state == "RUNNING"


@pytest.mark.parametrize("line", ["debug|up|2", "debug|up|x|idle", "debug|maybe|2|idle"])
def test_sinfo_malformed(line: str) -> None:
    with pytest.raises(ParseError):
        parsers.parse_sinfo(line + "\n")


def test_states_and_usage_of_one_sacct_call() -> None:
    """``status`` of a running run asks states and GPU usage in one call (-D: a requeued
    job's earlier execution is a usage row, its newest row gives the state)."""
    rows, usage = parsers.parse_sacct_usage(
        "12_0|FAILED|1:0|60|billing=1,gres/gpu=2\n12_0|COMPLETED|0:0|30|gres/gpu=2\n"
        "12_1|CANCELLED by 0|0:15|0|\n")
    assert [(r.job_id, r.state) for r in rows][-2:] == [("12_0", "COMPLETED"),
                                                         ("12_1", "CANCELLED")]
    assert [(u.job_id, u.elapsed_s, u.gpus) for u in usage] == [
        ("12_0", 60, 2), ("12_0", 30, 2), ("12_1", 0, 0)]
    with pytest.raises(ParseError):
        parsers.parse_sacct_usage("12_0|COMPLETED|0:0\n")
