"""Damaged state files (issue 13, item 5): one verification of a winner everywhere, progress
never outranks a winner or a terminal attempt, merge and retry carry on around bad shards
and name each one, logs are found by listing when the attempt record is damaged.

The damage is literal: a truncated ``attempt.json``, a ``winner.json`` that is a symlink to
a valid winner, a winner naming another shard, garbage bytes in ``progress.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict

import pytest
from click.testing import CliRunner, Result

from synthbatch.agent_stdlib.candidate import build_manifest
from synthbatch.agent_stdlib.contracts import WinnerRecord, sha256_bytes
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.publish import load_winner
from synthbatch.agent_stdlib.statefile import StateError, ensure_dir, publish_json_immutable
from synthbatch.control.cli.main import cli
from synthbatch.control.runs.merge import merge_run
from synthbatch.control.runs.retry import select
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.listing import durable_state
from synthbatch.control.runs.status.records import Expected, scan_shard
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.runs.store import load_plan
from synthbatch.control.slurm.runner import CommandResult
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import RUN_ID, SbatchRecorder, Shard, make_run

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
GARBAGE = b"\x00\xff{progress: \x07 not json"


def real_winner(layout: RunLayout, shard: int, offset: int, count: int = 10) -> WinnerRecord:
    """Output, result manifest and winner of attempt 1, as the agent publishes them."""
    out = ensure_dir(layout.attempt(shard, 1).output)
    (out / "records.jsonl").write_text("".join(json.dumps({"index": i}) + "\n"
                                               for i in range(offset, offset + count)))
    manifest = build_manifest(out, shard, 1, count)
    return WinnerRecord(shard=shard, attempt=1, records=count,
                        result_sha256=sha256_bytes(manifest.to_json().encode()),
                        files=manifest.files, created_at=1.0)


def truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def damaged_run(workspace: Path) -> RunLayout:
    """Six shards of ten records.

    0: a sound winner, garbage progress.json      -> succeeded
    1: truncated attempt.json (it had failed)     -> unknown; not retried; logs still found
    2: winner.json is a symlink to a valid winner -> unknown, never succeeded
    3: failed, healthy                            -> retried
    4: failed, garbage progress.json              -> failed; retried
    5: winner.json names shard 0                  -> unknown
    """
    layout = make_run(workspace, [Shard("succeeded"), Shard("failed", "boom"),
                                  Shard("succeeded"), Shard("failed", "boom"),
                                  Shard("failed", "boom"), Shard("succeeded")])
    publish_json_immutable(layout.winner_json(0), real_winner(layout, 0, 0).to_dict())
    layout.attempt(0, 1).progress_json.write_bytes(GARBAGE)
    truncate(layout.attempt(1, 1).attempt_json)
    client = ensure_dir(layout.attempt(1, 1).execution_logs(1)) / "client.log"
    client.write_text("client of the damaged shard\n")
    elsewhere = workspace / "elsewhere-winner.json"
    elsewhere.write_text(json.dumps(real_winner(layout, 2, 20).to_dict()))
    layout.winner_json(2).symlink_to(elsewhere)
    layout.attempt(4, 1).progress_json.write_bytes(GARBAGE)
    publish_json_immutable(layout.winner_json(5), real_winner(layout, 0, 0).to_dict())
    return layout


# ----------------------------------------------------------------------------- one winner check


def test_a_winner_is_verified_the_same_way_everywhere(tmp_path: Path) -> None:
    layout = damaged_run(tmp_path)
    assert load_winner(layout, 0) is not None
    with pytest.raises(StateError, match=r"winner.json: cannot open \(a symbolic link\)"):
        load_winner(layout, 2)
    with pytest.raises(StateError, match="winner.json: names shard 0, not 5"):
        load_winner(layout, 5)
    views = [scan_shard(layout, i, Expected(1, None, 0.0)) for i in range(6)]
    assert [v.winner for v in views] == [True, False, False, False, False, False]
    assert "a symbolic link" in views[2].winner_problem
    assert "names shard 0, not 5" in views[5].winner_problem
    assert views[0].progress is None and "progress.json: not valid JSON" in \
        views[0].progress_problem
    assert durable_state(layout, 6)["counts"] == {"failed": 2, "succeeded": 1, "unknown": 3}


def test_a_fifo_in_place_of_a_winner_is_refused_not_waited_on(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("succeeded")])
    os.mkfifo(layout.winner_json(0))
    view = scan_shard(layout, 0, Expected(1, None, 0.0))
    assert not view.winner and "winner.json: not a regular file" in view.winner_problem


def test_status_progress_never_outranks_a_winner_or_a_terminal_attempt(tmp_path: Path) -> None:
    layout = damaged_run(tmp_path)
    data = observe(layout, Scheduler(runner=SbatchRecorder()), now=time.time())
    states = [s["state"] for s in data["shards"]]
    assert states == ["succeeded", "unknown", "unknown", "failed", "failed", "unknown"]
    reasons = [s["reason"] or "" for s in data["shards"]]
    assert "attempt.json: not valid JSON" in reasons[1]
    assert "winner.json: cannot open (a symbolic link)" in reasons[2]
    assert reasons[4] == "boom"  # the agent's reason, not the progress file's problem
    assert {f["shard"] for f in data["failures"]} == {1, 2, 3, 4, 5}
    assert data["records_done"] == 10


def test_progress_problem_is_shown_for_a_running_shard(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    layout.attempt(0, 1).progress_json.write_bytes(GARBAGE)
    from tests.fakes import FakeSlurm as QueueFake

    fake = QueueFake()
    fake.on("squeue", stdout="500_0|RUNNING|None\n")
    row = observe(layout, Scheduler(runner=fake), now=time.time())["shards"][0]
    assert row["state"] == "running" and "progress.json: not valid JSON" in row["reason"]


def test_a_damaged_winner_is_unknown_in_the_table() -> None:
    verdict = norm.decide(norm.Evidence(winner_problem="x/winner.json: not a regular file",
                                        attempt_state="succeeded"))
    assert verdict == norm.Verdict(norm.UNKNOWN, "x/winner.json: not a regular file", "winner")


# ----------------------------------------------------------------------------- merge


def test_plain_merge_names_every_bad_shard(tmp_path: Path) -> None:
    from synthbatch.control.errors import Conflict

    layout = damaged_run(tmp_path)
    with pytest.raises(Conflict) as info:
        merge_run(layout, None, allow_partial=False)
    message = info.value.message
    assert f"run {RUN_ID}: shards without a winner: 1, 3, 4" in message
    assert "shard 2: " in message and "a symbolic link" in message
    assert "shard 5: " in message and "names shard 0, not 5" in message


def test_partial_merge_leaves_bad_shards_out_and_says_why(tmp_path: Path) -> None:
    layout = damaged_run(tmp_path)
    manifest = merge_run(layout, None, allow_partial=True)
    assert manifest["records"] == 10 and manifest["complete"] is False
    assert manifest["missing_shards"] == [1, 2, 3, 4, 5]
    assert [b["shard"] for b in manifest["bad_shards"]] == [2, 5]
    assert "a symbolic link" in manifest["bad_shards"][0]["reason"]
    lines = (layout.merged / "records.jsonl").read_text().splitlines()
    assert [json.loads(x)["index"] for x in lines] == list(range(10))


def test_content_failing_its_digest_in_two_shards_names_both(tmp_path: Path) -> None:
    from synthbatch.control.errors import Conflict

    layout = make_run(tmp_path, [Shard("succeeded")] * 3)
    for shard in range(3):
        publish_json_immutable(layout.winner_json(shard),
                               real_winner(layout, shard, 10 * shard).to_dict())
    for shard in (0, 2):  # same size, other bytes
        path = layout.attempt(shard, 1).output / "records.jsonl"
        path.write_bytes(path.read_bytes().replace(b'"index"', b'"INDEX"'))
    with pytest.raises(Conflict) as info:
        merge_run(layout, None, allow_partial=False)
    assert "shard 0: " in info.value.message and "shard 2: " in info.value.message
    assert "does not match its winner's digest" in info.value.message
    assert not (layout.merged / "records.jsonl").exists()
    manifest = merge_run(layout, None, allow_partial=True)
    assert manifest["missing_shards"] == [0, 2] and manifest["records"] == 10
    assert [json.loads(x)["index"] for x in
            (layout.merged / "records.jsonl").read_text().splitlines()] == list(range(10, 20))


# ----------------------------------------------------------------------------- retry


def test_retry_skips_damaged_shards_and_selects_the_healthy_ones(tmp_path: Path) -> None:
    layout = damaged_run(tmp_path)
    selection = select(layout, load_plan(layout))
    assert [c.shard for c in selection.choices] == [3, 4]
    assert sorted(selection.skipped) == [1, 2, 5] and not selection.refused
    assert "attempt.json: not valid JSON" in selection.skipped[1]
    named = select(layout, load_plan(layout), shards=[1, 3])
    assert sorted(named.refused) == [1]  # named shards stay all-or-nothing


# ----------------------------------------------------------------------------- every CLI


@pytest.fixture
def cli_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, object]:
    from synthbatch.control import api

    workspace = tmp_path / "ws"
    layout = damaged_run(workspace)
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(workspace))))
    slurm = SbatchRecorder()  # answers sbatch and scontrol release, fails on anything else

    def runner(argv, timeout):  # noqa: ANN001 - the Runner protocol
        if argv[0].rsplit("/", 1)[-1] == "sacct":  # a running run's GPU-hours so far
            return CommandResult(list(argv), 0, "", "")
        return slurm(argv, timeout)

    monkeypatch.setattr(api, "scheduler_for", lambda prof: Scheduler(runner=runner))
    monkeypatch.setenv("HOME", str(tmp_path))
    return {"layout": layout, "profile": str(profile), "slurm": slurm}


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=True)


def test_the_damaged_run_through_status_merge_retry_and_logs(cli_run, tmp_path: Path) -> None:
    profile, layout = cli_run["profile"], cli_run["layout"]
    status = run_cli("status", RUN_ID, "--profile", profile, "--json")
    assert status.exit_code == 0, status.output
    data = json.loads(status.stdout)
    assert data["counts"] == {"failed": 2, "succeeded": 1, "unknown": 3}
    assert [s["state"] for s in data["shards"]][:1] == ["succeeded"]
    runs = json.loads(run_cli("runs", "--profile", profile, "--json").stdout)["runs"]
    assert runs[0]["counts"] == data["counts"]

    refused = run_cli("merge", RUN_ID, "--profile", profile)
    assert refused.exit_code == 4
    assert "shards without a winner: 1, 3, 4" in refused.stderr
    assert "shard 2: " in refused.stderr and "shard 5: " in refused.stderr
    partial = run_cli("merge", RUN_ID, "--allow-partial", "--profile", profile)
    assert partial.exit_code == 0, partial.output
    assert "left out shard 2: " in partial.stdout and "left out shard 5: " in partial.stdout

    retried = run_cli("retry", RUN_ID, "--yes", "--json", "--profile", profile)
    assert retried.exit_code == 4, retried.output  # something was not retried
    done = json.loads(retried.stdout)
    assert [s["shard"] for s in done["shards"]] == [3, 4] and len(done["submissions"]) == 1
    assert [why.split(":")[0] for why in done["skipped"]] == ["shard 1", "shard 2", "shard 5"]
    error = json.loads(retried.stderr)["error"]
    assert error["code"] == "conflict" and "3 shard(s) not retried" in error["message"]
    assert layout.attempt(3, 2).attempt_json.is_file()
    assert not layout.attempt(1, 2).root.exists()

    logs = run_cli("logs", RUN_ID, "--shard", "1", "--profile", profile)
    assert logs.exit_code == 0, logs.output
    assert logs.stdout == "client of the damaged shard\n"
    assert "shard 1 attempt 1 execution 1: client" in logs.stderr


def test_a_truncated_attempt_record_beside_a_winner_keeps_the_verdict_and_is_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 7: it showed ``succeeded`` with ``attempt: null`` and no note. The
    winner decides (succeeded, its attempt named); the damaged record is reported in
    ``status``, ``status --json`` and ``api.status``."""
    from synthbatch.control import api

    workspace = tmp_path / "ws"
    layout = make_run(workspace, [Shard("succeeded"), Shard("succeeded")])
    for shard in (0, 1):
        publish_json_immutable(layout.winner_json(shard),
                               real_winner(layout, shard, 10 * shard).to_dict())
    truncate(layout.attempt(1, 1).attempt_json)
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(workspace))))
    from tests.fakes import FakeSlurm

    slurm = FakeSlurm()
    slurm.on("sacct")  # the usage of the ended run: nothing known
    monkeypatch.setattr(api, "scheduler_for", lambda prof: Scheduler(runner=slurm))
    monkeypatch.setenv("HOME", str(tmp_path))
    damaged = f"{layout.attempt(1, 1).attempt_json}: not valid JSON"

    data = json.loads(run_cli("status", RUN_ID, "--profile", str(profile), "--json").stdout)
    assert [(s["state"], s["attempt"]) for s in data["shards"]] == [("succeeded", 1),
                                                                   ("succeeded", 1)]
    notes = [n for n in data["notes"] if n.startswith("shard 1: ")]
    assert len(notes) == 1 and "its winner, attempt 1, decides" in notes[0] \
        and damaged in notes[0], data["notes"]
    human = run_cli("status", RUN_ID, "--profile", str(profile))
    assert human.exit_code == 0 and f"note: {notes[0]}" in human.stdout, human.output
    assert notes[0] in api.status(RUN_ID, str(profile)).notes
    assert not any(n.startswith("shard 0: ") for n in data["notes"])


# ----------------------------------------------------------------------------- settled index


def test_damaged_shards_are_never_kept_in_the_settled_index(tmp_path: Path) -> None:
    """Status keeps only shards whose every record read cleanly: the second refresh (from
    the index) says what the first said, and the damaged shards are read again each time."""
    from synthbatch.control.runs.status import index as settled

    layout = damaged_run(tmp_path)
    now = time.time()
    first = observe(layout, Scheduler(runner=SbatchRecorder()), now=now)
    index = settled.load(layout)
    assert index.shards == [3]  # 0: garbage progress; 1, 2, 5: damaged; 4: garbage progress
    second = observe(layout, Scheduler(runner=SbatchRecorder()), now=now)
    assert second == first
    assert durable_state(layout, 6, run_id=RUN_ID)["counts"] == durable_state(layout, 6)["counts"] \
        == {"failed": 2, "succeeded": 1, "unknown": 3}
    manifest = merge_run(layout, None, allow_partial=True)  # merge reads winners, not the index
    assert manifest["missing_shards"] == [1, 2, 3, 4, 5]


def test_a_half_written_index_is_ignored_and_rebuilt(tmp_path: Path) -> None:
    layout = damaged_run(tmp_path)
    now = time.time()
    first = observe(layout, Scheduler(runner=SbatchRecorder()), now=now)
    path = layout.settled_json
    path.write_bytes(path.read_bytes()[:-30])  # torn: the digest line is cut
    again = observe(layout, Scheduler(runner=SbatchRecorder()), now=now)
    assert {**again, "notes": []} == first
    assert "settled index not used" in again["notes"][0]
    assert "digest missing or wrong" in again["notes"][0]
    assert durable_state(layout, 6, run_id=RUN_ID)["counts"] == first["counts"]
# ----------------------------------------------------------------------------- found by fuzzing


def _set_job_id(layout: RunLayout, shard: int, job_id: str) -> None:
    path = layout.attempt(shard, 1).attempt_json
    record = json.loads(path.read_text())
    record["job_id"] = job_id
    path.write_text(json.dumps(record))


def test_a_job_id_that_is_not_one_is_the_shards_problem_never_a_slurm_argument(
        tmp_path: Path) -> None:
    # status crashed with int('--state=RUNNING') (exit 1); cancel passed it to scancel,
    # where it is an option: every running job of the user
    from tests.fakes import FakeSlurm as QueueFake

    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    _set_job_id(layout, 1, "--state=RUNNING")
    fake = QueueFake()
    fake.on("squeue", stdout="500_0|RUNNING|None\n")
    fake.on("sacct", stdout="")
    fake.on("scancel")
    rows = observe(layout, Scheduler(runner=fake), now=time.time())["shards"]
    assert rows[0]["state"] == "running"
    assert rows[1]["state"] == "unknown"
    assert "attempt.json: field 'job_id' is not a Slurm job id" in rows[1]["reason"]
    from synthbatch.control.runs.cancel import cancel_run

    cancel_run(layout, Scheduler(runner=fake), wait_s=0)
    scancel = [call for call in fake.calls if call[0] == "scancel"]
    assert scancel and all(not arg.startswith("-") for call in scancel for arg in call[1:])


def test_the_scheduler_refuses_a_job_id_that_is_not_one() -> None:
    from synthbatch.control.errors import InvalidInput
    from tests.fakes import FakeSlurm as QueueFake

    fake = QueueFake()
    for call in (lambda s: s.cancel(["12", "-u"]), lambda s: s.queue(["12_x"]),
                 lambda s: s.accounting(["1,2"]), lambda s: s.release("--hold")):
        with pytest.raises(InvalidInput, match="not a Slurm job id"):
            call(Scheduler(runner=fake))
    assert fake.calls == []


def test_a_damaged_submission_record_still_shows_every_shard(tmp_path: Path) -> None:
    # status raised the StateError (exit 1, no shard shown): it now reads each shard by
    # listing its folders and notes the damaged record
    from tests.fakes import FakeSlurm as QueueFake

    layout = make_run(tmp_path, [Shard("succeeded"), Shard("running")])
    publish_json_immutable(layout.winner_json(0), real_winner(layout, 0, 0).to_dict())
    layout.submission_json(1).write_text('{"schema_version": 1, "number": "x"')
    fake = QueueFake()
    fake.on("squeue", stdout="500_1|RUNNING|None\n")
    data = observe(layout, Scheduler(runner=fake), now=time.time())
    assert [row["state"] for row in data["shards"]] == ["succeeded", "running"]
    assert any("0001.json: not valid JSON" in note for note in data["notes"]), data["notes"]


def test_status_printed_while_slurm_is_unreachable_is_made_visible(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the exit-5 path printed the summary with click.echo, past text.visible: a plan's
    # run id (or any other text from the records) reached the terminal raw
    from synthbatch.control import api
    from tests.fakes import FakeSlurm as QueueFake

    layout = make_run(tmp_path / "ws", [Shard("running")])
    layout.plan_json.chmod(0o600)
    plan = json.loads(layout.plan_json.read_text())
    plan["run_id"] += "\x1b]0;owned\x07"
    layout.plan_json.write_text(json.dumps(plan))
    fake = QueueFake()
    fake.on("squeue", code=1, stderr="squeue: error: Unable to contact slurm controller "
                                     "(connect failure)\n")
    fake.on("sacct", code=1, stderr="sacct: error: Problem talking to the database: "
                                   "Connection refused\n")
    monkeypatch.setattr(api, "scheduler_for", lambda prof: Scheduler(runner=fake))
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(tmp_path / "ws"))))
    result = run_cli("status", RUN_ID, "--profile", str(profile))
    assert result.exit_code == 5, result.output
    assert "\x1b" not in result.stdout and "\\x1b]0;owned\\x07" in result.stdout


# ----------------------------------------------------------------------------- another user's file

OTHER_UID = 65534  # nobody
MARKER = "READ-ANOTHER-USERS-FILE"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def plant_foreign(path: Path, payload: bytes, store: Path) -> None:
    """Replace ``path`` with a hard link to a file of ``payload`` owned by another user (as
    someone who can write the attempt folder would plant it)."""
    store.mkdir(exist_ok=True)
    foreign = store / f"{len(list(store.iterdir()))}-{path.name}"
    foreign.write_bytes(payload)
    os.chown(foreign, OTHER_UID, OTHER_UID)
    if path.exists():
        path.unlink()
    os.link(foreign, path)
    assert path.stat().st_uid == OTHER_UID and path.stat().st_nlink == 2


def foreign_run(workspace: Path) -> RunLayout:
    """Four shards, each with one record replaced by a hard link to another user's file
    holding a record that would read as valid.

    0: winner.json (a valid winner of shard 0)           -> unknown, refused
    1: attempt.json (a failed attempt with MARKER)       -> unknown, refused
    2: progress.json (7 records done, reason MARKER)     -> no progress, refused
    3: output/records.jsonl (the winner's very bytes)    -> merge leaves shard 3 out
    """
    layout = make_run(workspace, [Shard("succeeded"), Shard("failed", "boom"),
                                  Shard("running", progress=3), Shard("succeeded")])
    store = workspace.parent / "other-user"
    plant_foreign(layout.winner_json(0),
                  real_winner(layout, 0, 0).to_json().encode(), store)
    record = json.loads(layout.attempt(1, 1).attempt_json.read_text())
    plant_foreign(layout.attempt(1, 1).attempt_json,
                  json.dumps({**record, "reason": MARKER}).encode(), store)
    progress = json.loads(layout.attempt(2, 1).progress_json.read_text())
    plant_foreign(layout.attempt(2, 1).progress_json,
                  json.dumps({**progress, "records_done": 7}).encode(), store)
    publish_json_immutable(layout.winner_json(3), real_winner(layout, 3, 30).to_dict())
    output = layout.attempt(3, 1).output / "records.jsonl"
    plant_foreign(output, output.read_bytes(), store)
    return layout


@needs_root
def test_a_hard_link_to_another_users_file_is_refused_per_shard(tmp_path: Path) -> None:
    layout = foreign_run(tmp_path / "ws")
    refused = f"owned by uid {OTHER_UID}, not by this user"
    with pytest.raises(StateError, match=f"winner.json: {refused}"):
        load_winner(layout, 0)
    views = [scan_shard(layout, i, Expected(1, None, 0.0)) for i in range(4)]
    assert [v.winner for v in views] == [False, False, False, True]
    assert refused in views[0].winner_problem
    assert views[1].attempt is None and refused in views[1].problem
    assert views[2].progress is None and refused in views[2].progress_problem
    from tests.fakes import FakeSlurm as QueueFake

    fake = QueueFake()
    fake.on("squeue", stdout="500_2|RUNNING|None\n")
    data = observe(layout, Scheduler(runner=fake), now=time.time())
    text = json.dumps(data)
    assert MARKER not in text
    reasons = [s["reason"] or "" for s in data["shards"]]
    assert data["shards"][0]["state"] == "unknown" and refused in reasons[0]
    assert data["shards"][1]["state"] == "unknown" and refused in reasons[1]
    assert data["shards"][2]["records_done"] != 7
    manifest = merge_run(layout, None, allow_partial=True)
    assert manifest["missing_shards"] == [0, 1, 2, 3]
    assert [b["shard"] for b in manifest["bad_shards"]] == [0, 3]
    assert refused in manifest["bad_shards"][1]["reason"]
    assert "records.jsonl" in manifest["bad_shards"][1]["reason"]


@needs_root
def test_the_agent_refuses_another_users_file_in_output(tmp_path: Path) -> None:
    from synthbatch.agent_stdlib.candidate import CandidateError, verify_files

    out = ensure_dir(tmp_path / "output")
    (out / "a.jsonl").write_text('{"index": 0}\n')
    files = build_manifest(out, 0, 1, 1).files
    plant_foreign(out / "a.jsonl", b'{"index": 0}\n', tmp_path / "other-user")
    with pytest.raises(CandidateError, match=f"output/a.jsonl: owned by uid {OTHER_UID}"):
        build_manifest(out, 0, 1, 1)
    with pytest.raises(CandidateError, match=f"a.jsonl: owned by uid {OTHER_UID}"):
        verify_files(out, files)


def test_a_record_published_by_link_is_ours_and_read(tmp_path: Path) -> None:
    # publish_immutable links a temp file of ours: the owner, not st_nlink, is the rule
    layout = make_run(tmp_path / "ws", [Shard("succeeded")])
    publish_json_immutable(layout.winner_json(0), real_winner(layout, 0, 0).to_dict())
    extra = layout.root / "second-link"
    os.link(layout.winner_json(0), extra)  # two links, both ours
    assert layout.winner_json(0).stat().st_nlink == 2
    assert load_winner(layout, 0) is not None


@needs_root
def test_logs_refuses_a_log_linked_to_another_users_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    workspace = tmp_path / "ws"
    layout = make_run(workspace, [Shard("failed", "boom")])
    client = ensure_dir(layout.attempt(0, 1).execution_logs(1)) / "client.log"
    plant_foreign(client, f"{MARKER}\n".encode(), tmp_path / "other-user")
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(workspace))))
    monkeypatch.setenv("HOME", str(tmp_path))
    for json_flag in ((), ("--json",)):
        result = run_cli("logs", RUN_ID, "--shard", "0", "--step", "client", *json_flag,
                         "--profile", str(profile))
        assert result.exit_code == 4, result.output
        assert MARKER not in result.output
        assert f"client.log: owned by uid {OTHER_UID}" in result.stderr
