"""Slurm-style overrides at plan and submit: -p/-A/-q/-t/--reservation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.control.config.overrides import Overrides
from synthbatch.control.errors import InvalidInput
from tests.conftest import REPO
from tests.fakes import invoke

FAKE = REPO / "examples" / "fake-server.toml"


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan without a cluster (partitions -p names do not exist on the testbed)."""
    monkeypatch.delenv("SLURM_CONF", raising=False)


def planned(profile_file: Path, *flags: str) -> dict:
    result = invoke("plan", str(FAKE), "--profile", str(profile_file), "--json", *flags)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_overrides_beat_the_profile_and_the_run_file(profile_file: Path) -> None:
    data = planned(profile_file, "-p", "gpu", "-A", "proj-42", "-q", "high", "-t", "02:30:00",
                   "--reservation", "maint")
    res = data["plan"]["resources"]
    assert (res["partition"], res["account"], res["qos"], res["time_limit"],
            res["reservation"]) == ("gpu", "proj-42", "high", "02:30:00", "maint")
    assert data["overrides"] == {"partition": "gpu", "account": "proj-42", "qos": "high",
                                 "time_limit": "02:30:00", "reservation": "maint"}
    script = data["script"].splitlines()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj-42", "#SBATCH --qos=high",
                 "#SBATCH --time=02:30:00", "#SBATCH --reservation=maint"):
        assert line in script


def test_long_forms_and_nothing_given(profile_file: Path) -> None:
    data = planned(profile_file, "--partition", "gpu", "--time", "45")
    assert data["plan"]["resources"]["partition"] == "gpu"
    assert data["plan"]["resources"]["time_limit"] == "45"
    plain = planned(profile_file)
    assert plain["overrides"] == {} and plain["plan"]["resources"]["partition"] == "debug"
    assert plain["plan"]["resources"]["time_limit"] == "00:10:00"  # the run file's


@pytest.mark.parametrize("flags, fragment", [
    (["-p", "bad name"], "--partition: 'bad name' is not a name"),
    (["-t", "soon"], "--time: 'soon' is not a Slurm time limit"),
    (["-A", "a;rm -rf /"], "--account: "),
])
def test_a_bad_override_names_the_option(profile_file: Path, flags: list,
                                         fragment: str) -> None:
    result = invoke("plan", str(FAKE), "--profile", str(profile_file), *flags)
    assert result.exit_code == 2
    assert fragment in result.stderr and len(result.stderr.splitlines()) == 1


def test_overrides_round_trip_and_refuse_unknown_fields() -> None:
    given = Overrides(partition="gpu", time_limit="10")
    assert Overrides.from_dict(given.to_dict()) == given
    with pytest.raises(InvalidInput, match="'nodes' is not one of"):
        Overrides.from_dict({"nodes": "4"})


def test_submit_takes_the_same_overrides() -> None:
    help_text = invoke("submit", "-h").stdout
    for option in ("-p, --partition", "-A, --account", "-q, --qos", "-t, --time",
                   "--reservation", "--gpus", "--wait", "--timeout"):
        assert option in help_text


def test_a_bad_merge_target_is_refused_at_submit_naming_the_flag(profile_file: Path,
                                                                  tmp_path: Path) -> None:
    result = invoke("submit", str(FAKE), "--profile", str(profile_file), "--merge-to",
                    str(tmp_path / "nowhere" / "x.jsonl"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("synthbatch: error: --merge-to ")
    assert "is not a directory" in result.stderr
    assert "--merge-to" in invoke("submit", "-h").stdout
