"""Who may use what: the parsers of the accounting's associations and QOS, reservations
and node features, on output captured from the testbeds (Slurm 22.05), and the Scheduler
calls that make them."""

from __future__ import annotations

import pytest

from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.slurm import parsers
from synthbatch.control.slurm.parsers import Association, ParseError, Reservation
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import FakeSlurm
from tests.slurm_outputs import (
    ASSOC,
    FEATURES,
    FEATURES_SET,
    NO_ACCOUNTING,
    NO_RESERVATIONS,
    QOS,
    RESERVATION,
)


def test_associations() -> None:
    assert parsers.parse_associations(ASSOC) == [
        Association("root", None, ("normal",)), Association("proj1", "gpu", ("normal", "high")),
        Association("proj2", None, ())]
    assert parsers.parse_associations("") == []


def test_qos_names() -> None:
    assert parsers.parse_qos_names(QOS + "high\n") == ["normal", "high"]


def test_reservations() -> None:
    assert parsers.parse_reservations(RESERVATION) == [
        Reservation(name="lc-capture", state="INACTIVE", start="2030-01-01T00:00:00",
                    users=("root",), accounts=("root",), partition=None)]
    assert parsers.parse_reservations(NO_RESERVATIONS) == []


def test_node_features() -> None:
    assert parsers.parse_node_features(FEATURES) == {"node1": (), "node2": ()}
    assert parsers.parse_node_features(FEATURES_SET) == {"node1": ("a100", "ib"),
                                                          "node2": ("h100",)}


@pytest.mark.parametrize("parse,text", [
    (parsers.parse_associations, "root|normal\n"),
    (parsers.parse_associations, "|x|normal\n"),
    (parsers.parse_qos_names, "a|b\n"),
    (parsers.parse_reservations, "StartTime=now State=ACTIVE\n"),
    (parsers.parse_node_features, "node1\n"),
])
def test_malformed_lines_are_parse_errors(parse, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError):
        parse(text)


def test_partition_deny_lists() -> None:
    line = ("PartitionName=p Default=NO State=UP TotalNodes=1 AllowAccounts=ALL "
            "DenyAccounts=bad,worse AllowQos=ALL DenyQos=slow\n")
    (part,) = parsers.parse_partitions(line)
    assert (part.deny_accounts, part.deny_qos) == (("bad", "worse"), ("slow",))


def test_the_scheduler_asks_sacctmgr_and_says_when_there_is_no_accounting() -> None:
    fake = FakeSlurm()
    fake.replies["sacctmgr"] = lambda args: (0, QOS if "qos" in args else ASSOC, "")
    sched = Scheduler(runner=fake)
    assert [a.account for a in sched.associations("alice")] == ["root", "proj1", "proj2"]
    assert sched.qos_names() == ["normal"]
    assert fake.calls[0][1:] == ["-n", "-P", "show", "assoc", "where", "user=alice",
                                 "format=Account,Partition,QOS"]
    off = FakeSlurm()
    off.on("sacctmgr", code=1, stderr=NO_ACCOUNTING)
    assert Scheduler(runner=off).associations("alice") is None
    assert Scheduler(runner=off).qos_names() is None
    down = FakeSlurm()
    down.on("sacctmgr", code=1, stderr="sacctmgr: error: Problem talking to the database: "
                                       "Connection refused\n")
    with pytest.raises(SchedulerUnavailable):
        Scheduler(runner=down).associations("alice")


def test_the_scheduler_asks_for_reservations_and_features() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", stdout=RESERVATION)
    fake.on("sinfo", stdout=FEATURES_SET)
    sched = Scheduler(runner=fake)
    assert [r.name for r in sched.reservations()] == ["lc-capture"]
    assert sched.node_features("debug")["node2"] == ("h100",)
    assert fake.calls[1][1:] == ["-N", "-h", "-p", "debug", "-o", "%N|%f"]
