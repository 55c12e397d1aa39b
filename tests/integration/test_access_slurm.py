"""The usual real-cluster mistakes, on the real testbed (issue 28.3): an account, QOS,
reservation or node feature the cluster does not have planned with exit 0 ("2 of 2
node(s) fit") and the job then ran as the user's default account. ``plan`` now fails each
with one line naming the flag and what exists; ``submit`` refuses it and queues nothing;
``profile validate`` says the same of a profile; without accounting the account and QOS
check says it was skipped."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import List

import pytest

from tests.integration.runs import invoke, write_profile, write_run

pytestmark = pytest.mark.slurm
USER = pwd.getpwuid(os.getuid()).pw_name


def errors(result) -> List[str]:  # type: ignore[no-untyped-def]
    return [f"{c['field']}: {c['message']}" for c in json.loads(result.stdout)["checks"]
            if c["level"] == "error"]


@pytest.mark.parametrize("flags,profile_extra,line", [
    (["-A", "bogus"], "", f"--account: bogus: not an account of user {USER} (have: "),
    (["-q", "bogus"], "", "--qos: bogus: no such QOS on this cluster (have: "),
    (["--reservation", "nosuch"], "", "--reservation: nosuch: no such reservation (have: "),
    ([], '[sbatch_options]\nconstraint = "h100"\n',
     "{profile}: sbatch_options.constraint: h100: feature h100 is on no node of partition "
     "debug (have: "),
])
def test_plan_and_submit_refuse_the_usual_mistakes(slurm_cluster, tmp_path: Path, python_exe,
                                                   flags, profile_extra, line) -> None:
    profile = write_profile(tmp_path, python_exe)
    profile.write_text(profile.read_text() + profile_extra)
    run_file = write_run(tmp_path, records=2, shards=1, latency=0.0)
    planned = invoke("plan", str(run_file), "--profile", str(profile), *flags, "--json")
    assert planned.exit_code == 2, planned.output
    (bad,) = errors(planned)
    assert bad.startswith(line.format(profile=profile)), bad
    submitted = invoke("submit", str(run_file), "--profile", str(profile), *flags)
    assert submitted.exit_code == 2 and "submit refused: " in submitted.stderr
    assert not (tmp_path / "workspace" / "runs").exists()  # nothing staged or queued


def test_what_the_user_has_plans(slurm_cluster, tmp_path: Path, python_exe) -> None:
    out = slurm_cluster.run("sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={USER}",
                            "format=Account").stdout
    account = out.split()[0]
    profile = write_profile(tmp_path, python_exe)
    run_file = write_run(tmp_path, records=2, shards=1, latency=0.0)
    planned = invoke("plan", str(run_file), "--profile", str(profile), "-A", account, "-q",
                     "normal", "--json")
    assert planned.exit_code == 0, planned.output
    assert errors(planned) == []


def test_profile_validate_says_the_same(slurm_cluster, tmp_path: Path, python_exe) -> None:
    (tmp_path / "workspace").mkdir()
    profile = write_profile(tmp_path, python_exe, account="bogus")
    result = invoke("profile", "validate", "--profile", str(profile))
    assert result.exit_code == 2, result.output
    assert f"FAIL  account    bogus: not an account of user {USER} (have: " in result.stdout


def test_without_accounting_the_account_check_is_skipped(slurm_cluster_noacct,
                                                         tmp_path: Path, python_exe) -> None:
    profile = write_profile(tmp_path, python_exe)
    run_file = write_run(tmp_path, records=2, shards=1, latency=0.0)
    planned = invoke("plan", str(run_file), "--profile", str(profile), "-A", "bogus",
                     "--json")
    assert planned.exit_code == 0, planned.output
    checks = json.loads(planned.stdout)["checks"]
    assert {"level": "ok", "field": "--account", "message": "account and QOS not checked: "
            "this cluster keeps no accounting (no slurmdbd)"} in checks
