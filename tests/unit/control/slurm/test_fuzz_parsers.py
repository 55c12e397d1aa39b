"""Fuzzing the scheduler output parsers (docs/reliability.md).

Random text, rows built from Slurm's own pieces (job ids, array ranges, states, exit
codes, ``by UID``) with random damage, and every output recorded from the real testbed
(``fixtures/slurm/*.json``) cut at a random point or with random bytes spliced in:

* the control plane's parsers return rows or raise ParseError, nothing else, and every
  row they return indexes (``index_rows``) without an error;
* through the typed client, such output is one of its typed errors: SchedulerUnavailable
  (exit 5), SchedulerUncertain (sbatch: the job may exist) or SchedulerRejected (a
  command that failed), each with a one-line message, never another exception;
* the agent's parsers of ``squeue -s`` and ``scontrol show`` output never raise at all.
"""

from __future__ import annotations

import json
from typing import Callable, List

from hypothesis import given
from hypothesis import strategies as st

from synthbatch.agent_stdlib.allocation import slurmjob
from synthbatch.agent_stdlib.allocation.steps import parse_steps
from synthbatch.control.errors import SynthbatchError
from synthbatch.control.slurm import parsers
from synthbatch.control.slurm.parsers import KNOWN_STATES, ParseError
from synthbatch.control.slurm.runner import CommandResult
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import fuzz

RECORDED = [call["stdout"] for path in sorted((REPO / "fixtures" / "slurm").glob("*.json"))
            for call in json.loads(path.read_text())["calls"] if call["stdout"]]
DIGITS = st.sampled_from(["0", "7", "12", "4294967295", "4294967296", "99999999999", "",
                          "\u0661", "\u00b2", "-1", "1e3", " 3"])
job_ids = st.one_of(
    DIGITS,
    st.builds("{}_{}".format, DIGITS, DIGITS),
    st.builds("{}_[{}-{}%{}]".format, DIGITS, DIGITS, DIGITS, DIGITS),
    st.builds("{}_[{}]".format, DIGITS, st.text("0123456789,-%", max_size=12)),
    st.builds("{}.{}".format, DIGITS, st.sampled_from(["batch", "extern", "0", "", "x y"])),
    st.text(max_size=12))
state_words = st.one_of(st.sampled_from(sorted(KNOWN_STATES)), st.text(max_size=10),
                        st.sampled_from(["CANCELLED by 0", "CANCELLED by ", "CANCELLED by x",
                                         "RUNNING ", "running", "OUT_OF_ME", "_", "A B"]))
exit_codes = st.one_of(st.builds("{}:{}".format, DIGITS, DIGITS), st.text(":0123456789",
                                                                         max_size=6))
rows = st.lists(st.builds("|".join, st.lists(st.one_of(job_ids, state_words, exit_codes,
                                                        st.text(max_size=8)),
                                              min_size=1, max_size=5)), max_size=6)
texts = st.one_of(st.text(max_size=200), rows.map("\n".join),
                  st.sampled_from(RECORDED) if RECORDED else st.nothing())


@st.composite
def damaged(draw: st.DrawFn) -> str:
    """A text from ``texts`` cut short and/or with random text spliced in."""
    text = draw(texts)
    if text and draw(st.booleans()):
        text = text[:draw(st.integers(0, len(text)))]
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=10)) + text[at:]
    return text


PARSERS: List[Callable[[str], object]] = [
    parsers.parse_sbatch_id, parsers.parse_squeue, parsers.parse_sacct, parsers.parse_sinfo,
    parsers.parse_max_array_size, parsers.split_job_id, parsers.expand_tasks]


@fuzz(ci=600, long=50_000)
@given(text=damaged())
def test_parsers_return_rows_or_raise_parse_error(text: str) -> None:
    for parser in PARSERS:
        try:
            result = parser(text)
        except ParseError:
            continue
        if parser in (parsers.parse_squeue, parsers.parse_sacct):
            parsers.index_rows(result)  # type: ignore[arg-type]


def _scheduler(stdout: str, code: int) -> Scheduler:
    def runner(argv, timeout):  # noqa: ANN001 - the Runner protocol
        return CommandResult(list(argv), code, stdout, "")
    return Scheduler(runner=runner)


@fuzz(ci=300, long=20_000)
@given(text=damaged(), code=st.sampled_from([0, 0, 1]))
def test_the_client_turns_unreadable_output_into_scheduler_errors(text: str,
                                                                  code: int) -> None:
    scheduler = _scheduler(text, code)
    calls = [lambda: scheduler.queue(["12_3"], name="synthbatch-x"),
             lambda: scheduler.accounting(["12"]), lambda: scheduler.partitions(),
             lambda: scheduler.max_array_size(), lambda: scheduler.jobs_named("x"),
             lambda: scheduler.submit_held_array("/s", [0, 1], 0, "x")]
    for call in calls:
        try:
            call()
        except SynthbatchError as err:
            assert err.message and "\n" not in err.message.strip()


@fuzz(ci=500, long=50_000)
@given(text=damaged(), restarts=st.integers(0, 3))
def test_the_agents_parsers_never_raise(text: str, restarts: int) -> None:
    parse_steps(text, "12_3")
    fields = slurmjob.parse_show_job(text)
    assert slurmjob.classify_termination(fields, restarts) in (
        slurmjob.REQUEUED, slurmjob.TIME_LIMIT, slurmjob.CANCELLED)
    slurmjob.parse_node_addrs(text)
    slurmjob.parse_hostnames(text)
