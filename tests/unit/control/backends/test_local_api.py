"""The seam: a local profile (or a run submitted locally) gets the local scheduler, and
status says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control import api
from synthbatch.control.backends.local.scheduler import LocalScheduler, Settings
from synthbatch.control.cli.render import backend_lines, status_text
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.workspace import load_workspace_profile
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import RUN_ID, Shard, make_run

LOCAL = REPO / "examples" / "profiles" / "local.toml"


def test_the_profiles_backend_picks_the_scheduler(profile_file: Path) -> None:
    assert isinstance(api.scheduler_for(load_model(profile_file, Profile)), Scheduler)
    full = api.scheduler_for(load_model(LOCAL, Profile))
    assert isinstance(full, LocalScheduler) and full.workspace == "/tmp/synthbatch-workspace"
    assert full.settings == Settings(gpus_per_node=0, gpus=None, max_concurrent=2,
                                     kill_wait_s=30.0)
    light = api.scheduler_for(load_workspace_profile(str(LOCAL)))  # status, cancel: reads
    assert isinstance(light, LocalScheduler) and light.settings is None


def test_a_run_is_asked_where_it_was_submitted(tmp_path: Path, profile_file: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    light = load_workspace_profile(str(profile_file))
    assert api._of_run(light, layout) is light  # not committed: the profile decides
    layout.run_json.write_text(json.dumps({"schema_version": 1, "backend": "local"}))
    assert isinstance(api.scheduler_for(api._of_run(light, layout)), LocalScheduler)
    full = api._of_run(load_model(profile_file, Profile), layout)
    assert full.backend == "local" and isinstance(api.scheduler_for(full), LocalScheduler)
    layout.run_json.write_text("{damaged")
    assert api._of_run(light, layout) is light


def test_status_says_backend_local_and_where_the_supervisor_is() -> None:
    base = {"run_id": "r", "state": "running", "records": 4, "records_done": 1,
            "counts": {"running": 1}, "shards": [], "notes": []}
    alive = {"job_id": "41", "alive": True, "pid": 77, "host": "ws1", "heartbeat_age_s": 1.5,
             "log": "/ws/local/jobs/41/supervisor.log", "stopped": False}
    data = {**base, "backend": {"name": "local", "supervisors": [
        {**alive, "job_id": "40", "alive": False, "stopped": True}, alive]}}
    assert backend_lines(data) == ["  backend local: job 41 supervisor pid 77 on ws1 (running, "
                                   "heartbeat 1.5 s ago; log /ws/local/jobs/41/supervisor.log)"]
    assert backend_lines(data)[0] in status_text(data).splitlines()
    gone = {**base, "backend": {"name": "local", "supervisors": [{**alive, "alive": False}]}}
    assert "supervisor pid 77 on ws1 (gone;" in backend_lines(gone)[0]
    assert backend_lines({**base, "backend": {"name": "slurm"}}) == []
    assert backend_lines(base) == []


def test_status_of_a_local_run_imports_no_pydantic(tmp_path: Path, workspace: Path) -> None:
    """As with Slurm (tests/unit/control/config/test_workspace.py): the local scheduler is
    built from the stdlib profile reader and reads its table without the contracts."""
    layout = make_run(workspace, [Shard("running")])
    record = json.loads(layout.run_json.read_text())
    layout.run_json.unlink()
    layout.run_json.write_text(json.dumps({**record, "backend": "local"}))
    profile = tmp_path / "local.toml"
    profile.write_text(LOCAL.read_text().replace('"/tmp/synthbatch-workspace"',
                                                 json.dumps(str(workspace))))
    code = ("import sys\nfrom synthbatch.control.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'"
            " or m == 'synthbatch.agent_stdlib.contracts'))")
    out = subprocess.run([sys.executable, "-c", code, "status", RUN_ID, "--profile",
                          str(profile), "--json"], capture_output=True, text=True, cwd=REPO,
                         check=False)
    printed, modules = out.stdout.strip().rsplit("\n", 1)
    assert modules == "[]", out.stderr
    status = json.loads(printed)  # its (empty) table answered, not Slurm
    assert status["backend"]["name"] == "local" and status["scheduler_error"] is None
