"""The usual real-cluster mistakes, caught before the queue (issue 28.3): an account, QOS,
reservation or node feature the cluster does not have for this user (with a fake Slurm
answering as the testbed did; the real one is in tests/integration/test_access_slurm.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List

import pytest

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.runs.checks import ERROR, NODE, OK, WARNING, Finding
from synthbatch.control.runs.fit import Origins, check_request
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import FakeSlurm, partition
from tests.slurm_outputs import (
    ASSOC,
    FEATURES,
    FEATURES_SET,
    NO_ACCOUNTING,
    NO_RESERVATIONS,
    QOS,
    RESERVATION,
)

NODES = "node1|8|4096|gpu:4|idle\nnode2|8|4096|gpu:4|idle\n"
FLAGS = Origins(account="-A", qos="-q", reservation="--reservation",
                constraint="profile.toml: sbatch_options.constraint")


def cluster(accounting: bool = True, reservations: str = NO_RESERVATIONS,
            features: str = FEATURES, part: str = "") -> FakeSlurm:
    fake = FakeSlurm()
    fake.replies["scontrol"] = lambda args: (0, reservations if "reservation" in args
                                             else part or partition(), "")
    fake.replies["sinfo"] = lambda args: (0, features if "%N|%f" in args else NODES, "")
    if accounting:
        fake.replies["sacctmgr"] = lambda args: (0, QOS + "high\n" if "qos" in args
                                                 else ASSOC, "")
    else:
        fake.on("sacctmgr", code=1, stderr=NO_ACCOUNTING)
    return fake


def request(**changes: object) -> ResourceSpec:
    base = ResourceSpec(partition="debug", account=None, qos=None, time_limit="01:00:00",
                        nodes=1, gpus=2, gpu_request="gres", cpus=4, mem_mb=2048)
    return replace(base, **changes)


def lines(found: List[Finding], level: str) -> List[str]:
    return [f.line() for f in found if f.level == level]


def check(fake: FakeSlurm, **changes: object) -> List[Finding]:
    return check_request(request(**changes), Scheduler(runner=fake), FLAGS, user="alice")


@pytest.mark.parametrize("changes,line", [
    ({"account": "bogus"}, "-A: bogus: not an account of user alice (have: proj1, proj2, "
                           "root)"),
    ({"account": "proj1"}, "-A: proj1: user alice's association with it is for partition "
                           "gpu only, not debug"),
    ({"qos": "bogus"}, "-q: bogus: no such QOS on this cluster (have: high, normal)"),
    ({"account": "root", "qos": "high"}, "-q: high: not a QOS of account root of user alice "
                                         "(allowed: normal)"),
    ({"reservation": "nosuch"}, "--reservation: nosuch: no such reservation (have: none)"),
    ({"options": {"constraint": "h100"}}, "profile.toml: sbatch_options.constraint: h100: "
                                          "feature h100 is on no node of partition debug "
                                          "(have: none)"),
])
def test_each_mistake_is_one_line_naming_the_flag_and_what_exists(
        changes: Dict[str, object], line: str) -> None:
    assert lines(check(cluster(), **changes), ERROR) == [line]


def test_what_the_user_has_is_ok() -> None:
    found = check(cluster(), account="root", qos="normal")
    assert lines(found, ERROR) == [] and "-A: root: an account of user alice" in \
        lines(found, OK)


def test_without_accounting_the_check_says_it_was_skipped() -> None:
    found = check(cluster(accounting=False), account="bogus", qos="bogus")
    assert lines(found, ERROR) == []
    assert "-A: account and QOS not checked: this cluster keeps no accounting (no slurmdbd)" \
        in lines(found, OK)


def test_nothing_asked_of_sacctmgr_when_nothing_is_set() -> None:
    fake = cluster()
    assert lines(check(fake), ERROR) == []
    assert "sacctmgr" not in [c[0] for c in fake.calls]


def test_an_accounting_database_that_does_not_answer_is_left_open() -> None:
    fake = cluster()
    fake.on("sacctmgr", code=1, stderr="sacctmgr: error: Problem talking to the database: "
                                       "Connection refused\n")
    found = check(fake, account="bogus")
    assert lines(found, ERROR) == [] and lines(found, NODE)[0].startswith(
        "-A: account and QOS not checked: sacctmgr failed: ")


def test_a_reservation_for_others_and_one_not_started() -> None:
    found = check(cluster(reservations=RESERVATION), reservation="lc-capture",
                  account="proj2")
    assert lines(found, ERROR) == ["--reservation: lc-capture: not open to user alice or "
                                   "account proj2 (users: root; accounts: root)"]
    found = check(cluster(reservations=RESERVATION), reservation="lc-capture")
    assert lines(found, WARNING) == ["--reservation: lc-capture: open to account(s) root "
                                     "only; the job's default account must be one of them"]
    found = check(cluster(reservations=RESERVATION), reservation="lc-capture",
                  account="root")
    assert lines(found, WARNING) == ["--reservation: lc-capture: INACTIVE until "
                                     "2030-01-01T00:00:00: the run waits for it"]


def test_constraints_count_the_nodes_that_have_every_feature() -> None:
    fake = cluster(features=FEATURES_SET)
    assert lines(check(fake, options={"constraint": "h100"}), ERROR) == []
    assert lines(check(fake, options={"constraint": "a100|h100"}), ERROR) == []
    assert lines(check(fake, options={"constraint": "[a100*1&ib]"}), ERROR) == []
    assert lines(check(fake, options={"constraint": "a100&h100"}), ERROR) == [
        "profile.toml: sbatch_options.constraint: a100&h100: 0 node(s) of partition debug "
        "have every feature (none); the job needs 1"]
    assert lines(check(fake, options={"constraint": "h100"}, nodes=2), ERROR) == [
        "profile.toml: sbatch_options.constraint: h100: 1 node(s) of partition debug have "
        "every feature (node2); the job needs 2"]


def test_a_denied_account_of_the_partition() -> None:
    part = partition().replace("AllowQos=ALL", "AllowQos=ALL DenyAccounts=root")
    assert lines(check(cluster(part=part), account="root"), ERROR) == [
        "-A: root is in partition debug's DenyAccounts (root)"]
