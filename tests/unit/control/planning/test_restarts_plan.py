"""``[retries] in_allocation`` of the run file reaches the plan the agent reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.conftest import GOLDENS, REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib



def _plan(**run_changes: object) -> Plan:
    data = tomllib.loads((REPO / "examples" / "fake-server.toml").read_text())
    data.update(run_changes)
    profile = Profile.model_validate(tomllib.loads(
        (REPO / "examples" / "profiles" / "testbed.toml").read_text()))
    return make_plan(RunConfig.model_validate(data), profile, "r-20240101-000000-abcdef",
                     Path("/srv/synthbatch/examples"))


def test_the_run_files_bound_is_the_plans() -> None:
    assert _plan().restarts_in_allocation == 2  # the default of a run file
    assert _plan(retries={"in_allocation": 0}).restarts_in_allocation == 0
    assert _plan(retries={"in_allocation": 5}).restarts_in_allocation == 5


def test_a_plan_written_before_restarts_means_no_restart() -> None:
    data = json.loads((GOLDENS / "plan.json").read_text())
    assert data.pop("restarts_in_allocation") == 2
    assert Plan.from_dict(data).restarts_in_allocation == 0
