"""``profile validate`` and ``plan`` run the same checks and agree (issue 28.3): a profile
whose default time limit is above the partition's MaxTime, a missing profile python, an
account, QOS, reservation or node feature the cluster does not have: each is a FAIL in
both, or in neither, through one cluster played by the same fake Slurm."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Set

import pytest

from synthbatch.control import api
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.runs.doctor import check_profile
from synthbatch.control.slurm.runner import CommandResult, run_command
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
PARTITION = ("PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime=00:45:00 "
             "MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] State=UP TotalCPUs=16 TotalNodes=2 "
             "MaxMemPerNode=UNLIMITED AllowAccounts=ALL AllowQos=ALL\n")
NODES = "node1|8|4096|gpu:4|idle\nnode2|8|4096|gpu:4|idle\n"
ASSOC, QOS = "root||normal\n", "normal\n"  # sacctmgr on the testbed
FEATURES, NO_RESERVATIONS = "node1|(null)\nnode2|(null)\n", "No reservations in the system\n"
# plan's levels as validate says them: "checked on the compute node" is a warn there
STATUS = {"error": "fail", "warning": "warn", "node": "warn", "ok": "ok"}


def slurm(argv: Sequence[str], timeout: float) -> CommandResult:
    """The testbed as Slurm answers it (MaxTime 45 min); anything else runs for real."""
    name, args = Path(argv[0]).name, list(argv[1:])
    if name == "scontrol":
        out = "MaxArraySize = 1001\n" if "config" in args else \
            NO_RESERVATIONS if "reservation" in args else PARTITION
    elif name == "sinfo":
        out = FEATURES if "%N|%f" in args else NODES if "-N" in args else \
            "debug*|up|2|gpu:4|45:00\n" if "%P|%a|%D|%G|%l" in args else "debug*|up|2|idle\n"
    elif name == "sacctmgr":
        out = QOS if "qos" in args else ASSOC
    else:
        return run_command(argv, timeout)
    return CommandResult(list(argv), 0, out, "")


CASES = {
    "all-good": {},
    "time-limit-above-maxtime": {"default_time_limit": "01:00:00"},
    "python-missing-beside-the-workspace": {"python": "{tmp}/nope/python3"},
    "python-on-a-node-only-path": {"python": "/dev/shm/synthbatch-nope/python3"},
    "account": {"account": "bogus"},
    "qos": {"qos": "bogus"},
    "reservation": {"reservation": "nosuch"},
    "constraint": {"sbatch_options": {"constraint": "h100"}},
    "account-and-qos-that-exist": {"account": "root", "qos": "normal"},
    "port-base-in-the-ephemeral-range": {"port_base": 40000},
}
NAMES = ("partition", "default_time_limit", "python", "account", "qos", "reservation",
         "sbatch_options.constraint", "port_base")


def statuses(pairs: List[tuple]) -> Dict[str, Set[str]]:
    out: Dict[str, Set[str]] = {}
    for name, status in pairs:
        out.setdefault(name, set()).add(status)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_and_plan_agree(case: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ws").mkdir()
    data = load_model(TESTBED, Profile).model_dump(mode="json")
    data.update(workspace=str(tmp_path / "ws"), python=sys.executable)
    data.update({k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v
                 for k, v in CASES[case].items()})
    prof = Profile.model_validate(data)
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(data))
    run = tmp_path / "run.toml"  # no time limit of its own: the profile's default applies
    run.write_text((REPO / "examples" / "fake-server.toml").read_text()
                   .replace("{config_dir}/..", str(REPO))
                   .replace('time_limit = "00:10:00"', ""))
    monkeypatch.setattr("synthbatch.control.runs.checks.run_command", slurm)

    validated = statuses([(c.name, c.status) for c in check_profile(prof, slurm,
                                                                    lambda n: "/x")])
    planned = api.plan(run, str(profile_file), Scheduler(runner=slurm))
    prefix = f"{profile_file}: "
    in_plan = statuses([(c.field[len(prefix):], STATUS[c.level]) for c in planned.checks
                        if c.field.startswith(prefix)])
    for name in NAMES:
        assert validated.get(name) == in_plan.get(name), (name, validated, in_plan)
    failed = {n for n in NAMES if "fail" in validated.get(n, set())}
    expected = {"all-good": set(), "python-on-a-node-only-path": set(),
                "account-and-qos-that-exist": set(), "port-base-in-the-ephemeral-range": set(),
                "time-limit-above-maxtime": {"default_time_limit"},
                "python-missing-beside-the-workspace": {"python"},
                "constraint": {"sbatch_options.constraint"}}
    assert failed == expected.get(case, {case}), (validated, in_plan)
    warned = {n for n in NAMES if "warn" in validated.get(n, set())}
    assert ("port_base" in warned) == (case == "port-base-in-the-ephemeral-range")
