"""State files (atomic, private, no symlinks) and the attempt/readiness state machines."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Iterator, List

import pytest

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import (
    advance_attempt,
    implied_attempt,
    load_attempt,
    load_readiness,
    publish_readiness,
)
from synthbatch.agent_stdlib.contracts import AttemptRecord, BackendStatus
from synthbatch.agent_stdlib.statefile import (
    StateError,
    dumps,
    ensure_dir,
    publish_immutable,
    publish_json_immutable,
    read_bytes,
    read_json,
    read_json_or_none,
    write_bytes_atomic,
    write_json_atomic,
)
from synthbatch.agent_stdlib.states import TransitionError, check_transition
from tests.fakes import create_attempt


@pytest.fixture(autouse=True)
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def leftovers(folder: Path) -> List[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


# ----------------------------------------------------------------------------- writes


def test_ensure_dir_creates_parents_private(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert ensure_dir(target) == target
    for folder in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert folder.is_dir() and mode(folder) == 0o700


def test_ensure_dir_existing_is_untouched(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir(mode=0o755)
    ensure_dir(tmp_path / "x")
    assert mode(tmp_path / "x") == 0o755


def test_ensure_dir_on_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(StateError, match="not a directory"):
        ensure_dir(tmp_path / "f")


def test_write_json_atomic(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"b": 1, "a": [1, 2]})
    assert mode(path) == 0o600
    assert path.read_bytes() == b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert read_json(path) == {"a": [1, 2], "b": 1}
    assert leftovers(tmp_path) == []


def test_dumps_is_canonical() -> None:
    assert dumps({"z": 1, "a": {"d": 2, "c": "é"}}) == dumps({"a": {"c": "é", "d": 2}, "z": 1})
    assert dumps({}).endswith(b"\n")


def test_write_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"v": 1})
    before = path.stat().st_ino
    with open(path, "rb") as old:
        write_json_atomic(path, {"v": 2})
        assert json.loads(old.read()) == {"v": 1}  # readers of the old file see it whole
    assert path.stat().st_ino != before  # a new inode was renamed over the old one
    assert read_json(path) == {"v": 2}
    assert mode(path) == 0o600
    assert leftovers(tmp_path) == []


def test_write_bytes_atomic_mode(tmp_path: Path) -> None:
    path = tmp_path / "agent.pyz"
    write_bytes_atomic(path, b"\x00" * 10, mode=0o400)
    assert mode(path) == 0o400
    write_bytes_atomic(path, b"abc", mode=0o400)  # replacing a read-only file still works
    assert path.read_bytes() == b"abc"


def test_write_replaces_a_symlink_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text('{"keep": true}')
    link = tmp_path / "state.json"
    link.symlink_to(target)
    write_json_atomic(link, {"v": 1})
    assert not link.is_symlink()
    assert json.loads(target.read_text()) == {"keep": True}


def test_write_failure_leaves_no_temp(tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "state.json").mkdir()  # os.replace(file, non-empty dir) fails
    (folder / "state.json" / "x").write_text("")
    with pytest.raises(OSError):
        write_json_atomic(folder / "state.json", {"v": 1})
    assert leftovers(folder) == []


def test_write_large_payload(tmp_path: Path) -> None:
    payload = os.urandom(3 * 1024 * 1024)
    write_bytes_atomic(tmp_path / "big", payload)
    assert (tmp_path / "big").read_bytes() == payload


# ----------------------------------------------------------------------------- immutable


def test_publish_immutable_first_writer_wins(tmp_path: Path) -> None:
    path = tmp_path / "winner.json"
    assert publish_immutable(path, b"first\n") is True
    assert publish_immutable(path, b"second\n") is False
    assert path.read_bytes() == b"first\n"
    assert mode(path) == 0o600
    assert leftovers(tmp_path) == []


def test_publish_immutable_mode(tmp_path: Path) -> None:
    assert publish_immutable(tmp_path / "plan.json", b"{}\n", mode=0o400)
    assert mode(tmp_path / "plan.json") == 0o400


def test_publish_json_immutable(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    assert publish_json_immutable(path, {"b": 2, "a": 1})
    assert not publish_json_immutable(path, {"c": 3})
    assert path.read_bytes() == dumps({"a": 1, "b": 2})


def test_publish_immutable_race(tmp_path: Path) -> None:
    for round_ in range(5):
        path = tmp_path / f"winner-{round_}.json"
        barrier = threading.Barrier(8)
        results: List[bool] = [False] * 8
        errors: List[BaseException] = []

        def writer(i: int, path: Path = path, barrier: threading.Barrier = barrier,
                   results: List[bool] = results,
                   errors: List[BaseException] = errors) -> None:
            try:
                barrier.wait()
                results[i] = publish_immutable(path, f"writer {i}\n".encode())
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert errors == []
        assert results.count(True) == 1
        winner = results.index(True)
        assert path.read_bytes() == f"writer {winner}\n".encode()
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- reads


def test_read_missing(tmp_path: Path) -> None:
    assert read_json(tmp_path / "nope.json") is None
    assert read_bytes(tmp_path / "nope.json") is None


@pytest.mark.parametrize("content", [b'{"revision": 3, "st', b"", b"garbage", b"\xff\xfe{}",
                                     b"{}{}"])
def test_read_half_written_or_garbage(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "attempt.json"
    path.write_bytes(content)
    with pytest.raises(StateError) as info:
        read_json(path)
    assert str(path) in str(info.value)
    assert "not valid JSON" in str(info.value)


@pytest.mark.parametrize("content", [b"[]", b"3", b'"x"', b"null"])
def test_read_non_object(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "attempt.json"
    path.write_bytes(content)
    with pytest.raises(StateError, match="expected a JSON object") as info:
        read_json(path)
    assert str(path) in str(info.value)


def test_read_symlink_refused(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text('{"a": 1}')
    link = tmp_path / "attempt.json"
    link.symlink_to(target)
    with pytest.raises(StateError) as info:
        read_json(link)
    assert str(link) in str(info.value) and "cannot open" in str(info.value)
    with pytest.raises(StateError):
        read_bytes(link)


def test_the_quiet_reader_is_the_one_reader_with_damage_as_none(tmp_path: Path) -> None:
    good, bad, link = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "link.json"
    good.write_text('{"a": 1}')
    bad.write_text('{"a": ')
    link.symlink_to(good)
    assert read_json_or_none(good) == {"a": 1}
    assert [read_json_or_none(p) for p in (bad, link, tmp_path / "none.json")] == [None] * 3


def test_a_bounded_read_stops_at_its_limit_and_reads_large_files_whole(tmp_path: Path
                                                                        ) -> None:
    """Status's bulk reads go through the one reader too, with a bound (issue 29)."""
    big = tmp_path / "plan.json"
    payload = b'{"a": "' + b"x" * (3 << 20) + b'"}'
    big.write_bytes(payload)
    assert read_bytes(big, len(payload) + 1) == payload == read_bytes(big)
    assert read_bytes(big, 100) == payload[:100]
    with pytest.raises(StateError, match="not valid JSON"):
        read_json(big, 100)
    assert read_json(big, 1 << 30) == {"a": "x" * (3 << 20)}
    link = tmp_path / "link.json"
    link.symlink_to(big)
    with pytest.raises(StateError):
        read_bytes(link, 100)


def test_read_dangling_symlink_refused(tmp_path: Path) -> None:
    link = tmp_path / "attempt.json"
    link.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(StateError):
        read_json(link)


def test_read_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "secret.json"
    path.write_text("{}")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running with privileges that ignore file modes")
        with pytest.raises(StateError, match="cannot open"):
            read_json(path)
    finally:
        path.chmod(0o600)


def test_read_directory_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "attempt.json").mkdir()
    with pytest.raises(StateError):
        read_json(tmp_path / "attempt.json")


# ----------------------------------------------------------------------------- attempts


def write_attempt(path: Path, state: str, revision: int = 4) -> bytes:
    record = AttemptRecord(run_id="r", shard=0, attempt=1, state=state, revision=revision,
                           updated_at=1.0)
    write_json_atomic(path, record.to_dict())
    return path.read_bytes()


def test_create_attempts_writes_created_records(tmp_path: Path) -> None:
    path = tmp_path / "attempt.json"
    record = create_attempt(path, "run-1", 3, 2)
    assert (record.state, record.revision, record.shard, record.attempt) == ("created", 1, 3, 2)
    assert load_attempt(path) == record
    assert mode(path) == 0o600


def test_legal_path_advances_revision_by_one(tmp_path: Path) -> None:
    path = tmp_path / "attempt.json"
    create_attempt(path, "run-1", 0, 1)
    revision = 1
    for state in (states.SUBMITTED, states.PENDING, states.RUNNING, states.RUNNING,
                  states.SUCCEEDED):
        record = advance_attempt(path, state)
        revision += 1
        assert record.state == state and record.revision == revision
        assert load_attempt(path) == record


def test_advance_sets_fields(tmp_path: Path) -> None:
    path = tmp_path / "attempt.json"
    create_attempt(path, "run-1", 2, 1)
    record = advance_attempt(path, states.SUBMITTED, job_id="12_2", submission=1)
    assert (record.job_id, record.submission, record.run_id) == ("12_2", 1, "run-1")
    record = advance_attempt(path, states.FAILED, reason="exit 3")
    assert record.reason == "exit 3" and record.job_id == "12_2"


LEGAL = [(a, b) for a in states.ATTEMPT_STATES for b in states.ATTEMPT_STATES
         if b in states.ATTEMPT_EDGES[a]]
ILLEGAL = [(a, b) for a in states.ATTEMPT_STATES for b in states.ATTEMPT_STATES
           if b not in states.ATTEMPT_EDGES[a]]


@pytest.mark.parametrize("current,new", LEGAL)
def test_every_legal_edge(tmp_path: Path, current: str, new: str) -> None:
    path = tmp_path / "attempt.json"
    write_attempt(path, current, revision=4)
    record = advance_attempt(path, new)
    assert (record.state, record.revision) == (new, 5)


@pytest.mark.parametrize("current,new", ILLEGAL)
def test_every_illegal_edge_leaves_file_unchanged(tmp_path: Path, current: str,
                                                  new: str) -> None:
    path = tmp_path / "attempt.json"
    before = write_attempt(path, current)
    with pytest.raises(TransitionError) as info:
        advance_attempt(path, new)
    assert f"{current} -> {new}" in str(info.value)
    assert path.read_bytes() == before


def test_edge_table_shape() -> None:
    assert set(states.ATTEMPT_EDGES) == set(states.ATTEMPT_STATES)
    for terminal in states.TERMINAL:
        assert states.ATTEMPT_EDGES[terminal] == frozenset()
    for targets in states.ATTEMPT_EDGES.values():
        assert targets <= set(states.ATTEMPT_STATES)
        assert states.CREATED not in targets  # nothing goes back to created
    assert len(ILLEGAL) > 0


@pytest.mark.parametrize("terminal", sorted(states.TERMINAL))
def test_terminal_records_never_change(tmp_path: Path, terminal: str) -> None:
    path = tmp_path / "attempt.json"
    before = write_attempt(path, terminal)
    for new in states.ATTEMPT_STATES:
        with pytest.raises(TransitionError):
            advance_attempt(path, new)
    assert path.read_bytes() == before


def test_unknown_states() -> None:
    with pytest.raises(TransitionError, match="unknown attempt state 'bogus'"):
        check_transition("bogus", states.RUNNING)
    with pytest.raises(TransitionError):
        check_transition(states.RUNNING, "bogus")


def test_advance_missing_attempt(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="missing"):
        advance_attempt(tmp_path / "attempt.json", states.SUBMITTED)


def test_load_attempt_off_contract(tmp_path: Path) -> None:
    path = tmp_path / "attempt.json"
    data = AttemptRecord(run_id="r", shard=0, attempt=1, state="created", revision=1,
                         updated_at=1.0).to_dict()
    data["revision"] = "1"
    path.write_text(json.dumps(data))
    with pytest.raises(StateError) as info:
        load_attempt(path)
    assert str(path) in str(info.value) and "AttemptRecord.revision" in str(info.value)


def test_load_attempt_missing(tmp_path: Path) -> None:
    assert load_attempt(tmp_path / "attempt.json") is None


# ----------------------------------------------------------------------------- readiness


def test_readiness_revisions_strictly_increase(tmp_path: Path) -> None:
    path = tmp_path / "readiness.json"
    assert load_readiness(path) is None
    seen = []
    for execution, state in ((1, "pending"), (1, "starting"), (1, "ready"), (1, "restarting"),
                             (2, "starting"), (2, "ready"), (2, "stopping"), (2, "stopped")):
        record = publish_readiness(path, 0, 1, execution, state)
        seen.append(record.revision)
        assert load_readiness(path) == record
    assert seen == list(range(1, len(seen) + 1))


def test_readiness_endpoints_and_backends(tmp_path: Path) -> None:
    path = tmp_path / "readiness.json"
    backends = {"tiny": (BackendStatus(url="http://127.0.0.1:20001", ready=True),
                         BackendStatus(url="http://127.0.0.1:20002", ready=False))}
    publish_readiness(path, 1, 2, 1, "starting")
    record = publish_readiness(path, 1, 2, 1, "ready",
                               endpoints={"tiny": "http://127.0.0.1:20000/v1"},
                               backends=backends)
    loaded = load_readiness(path)
    assert loaded == record
    assert loaded is not None and loaded.backends["tiny"][1].ready is False


def test_readiness_edges_are_checked_and_a_refused_one_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "readiness.json"
    with pytest.raises(TransitionError, match="illegal readiness transition none -> ready"):
        publish_readiness(path, 0, 1, 1, "ready")
    assert not path.exists()
    publish_readiness(path, 0, 1, 1, "starting")
    publish_readiness(path, 0, 1, 1, "stopping")
    before = path.read_bytes()
    with pytest.raises(TransitionError, match="stopping -> ready"):
        publish_readiness(path, 0, 1, 1, "ready")
    assert path.read_bytes() == before
    publish_readiness(path, 0, 1, 1, "stopped")
    assert publish_readiness(path, 0, 1, 2, "restarting").revision == 4  # the next execution


def test_readiness_unknown_state(tmp_path: Path) -> None:
    path = tmp_path / "readiness.json"
    publish_readiness(path, 0, 1, 1, "pending")
    before = path.read_bytes()
    with pytest.raises(ValueError, match="unknown readiness state"):
        publish_readiness(path, 0, 1, 1, "serving")
    assert path.read_bytes() == before


def test_readiness_malformed(tmp_path: Path) -> None:
    path = tmp_path / "readiness.json"
    path.write_text('{"schema_version": 1}')
    with pytest.raises(StateError, match="missing field"):
        load_readiness(path)


def test_write_many_json_replaces_each_file_atomically_with_private_modes(tmp_path):
    from synthbatch.agent_stdlib.statefile import write_many_json

    paths = [tmp_path / f"r{i}.json" for i in range(5)]
    paths[0].write_text('{"old": true}')
    write_many_json((p, {"i": i}) for i, p in enumerate(paths))
    assert [json.loads(p.read_text()) for p in paths] == [{"i": i} for i in range(5)]
    assert {oct(p.stat().st_mode & 0o777) for p in paths[1:]} == {"0o600"}
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(p.name for p in paths)



def test_canonical_is_json_dumps_byte_for_byte():
    import random

    from synthbatch.agent_stdlib.statefile import canonical

    rng = random.Random(20)

    def value(depth):
        pick = rng.random()
        if depth > 3 or pick < 0.5:
            return rng.choice([None, True, False, 0, -5, 3.5, 1e300, float("nan"), 0.1,
                               'a"b\\\u00e9\x01', "", 2 ** 70])
        if pick < 0.75:
            return {rng.choice(["a", "b", "c\u20ac", ""]) + str(i): value(depth + 1)
                    for i in range(rng.randint(0, 4))}
        return [value(depth + 1) for _ in range(rng.randint(0, 4))]

    for _ in range(5000):
        data = value(0)
        assert canonical(data) == json.dumps(data, sort_keys=True, indent=2)
    assert canonical({1: "x"}) == json.dumps({1: "x"}, sort_keys=True, indent=2)


def test_sync_filesystem_syncs_that_filesystem_not_the_machine(tmp_path, monkeypatch):
    from synthbatch.agent_stdlib import statefile

    monkeypatch.setattr(statefile.os, "sync", lambda: pytest.fail("sync(2) of every fs"))
    statefile.sync_filesystem(tmp_path)  # syncfs(2) of the one filesystem (Linux)


def test_submit_attempts_advances_created_ones_and_writes_no_new_record(tmp_path):
    from synthbatch.agent_stdlib.attempts import (
        advance_attempt,
        create_attempts,
        load_attempt,
        submit_attempts,
    )
    from synthbatch.agent_stdlib.states import TransitionError

    paths = [tmp_path / f"a{i}.json" for i in range(4)]
    create_attempts([(paths[1], "run", 1, 2, 1), (paths[2], "run", 2, 1, None),
                     (paths[3], "run", 3, 2, None)])
    advance_attempt(paths[2], "submitted", job_id="6_2")
    items = [(p, "run", i, 1 if i != 1 else 2, f"7_{i}", 3) for i, p in enumerate(paths)]
    with pytest.raises(StateError, match="a0.json: attempt record is missing"):
        submit_attempts(items)
    with pytest.raises(TransitionError):  # a2 is submitted already: nothing written
        submit_attempts(items[1:])
    assert load_attempt(paths[1]).state == "created"
    assert submit_attempts(items, only_created=True) == 2
    retried, kept, last = (load_attempt(p) for p in paths[1:])
    assert not paths[0].exists()  # a first attempt: implied, never written here
    assert (retried.state, retried.revision, retried.job_id, retried.resume_from,
            retried.attempt, retried.submission) == ("submitted", 2, "7_1", 1, 2, 3)
    assert (kept.job_id, kept.revision) == ("6_2", 2)
    assert (last.state, last.shard, last.job_id) == ("submitted", 3, "7_3")


# ------------------------------------------------------- first attempts implied by submission


def _implied(state_job: str = "7") -> AttemptRecord:
    return implied_attempt("r", 3, 1, f"{state_job}_3", 2, 100.0)


def test_implied_attempt_is_submitted_with_its_task_job_id_or_created() -> None:
    first = _implied()
    assert (first.state, first.revision, first.job_id, first.submission, first.updated_at) == (
        "submitted", 1, "7_3", 2, 100.0)
    unsent = implied_attempt("r", 3, 1, None, 2, 100.0)
    assert (unsent.state, unsent.job_id) == ("created", None)


def test_advance_from_an_implied_first_revision_makes_the_folder(tmp_path: Path) -> None:
    path = tmp_path / "shards" / "shard-00003" / "attempts" / "attempt-0001" / "attempt.json"
    record = advance_attempt(path, states.RUNNING, first=_implied(), node="n1")
    assert (record.state, record.revision, record.job_id, record.node) == (
        "running", 2, "7_3", "n1")
    assert load_attempt(path) == record
    assert all(oct(p.stat().st_mode & 0o777) == "0o700" for p in (path.parent,
               path.parent.parent, path.parent.parent.parent))
    # once there is a record, ``first`` is ignored: the record is advanced
    assert advance_attempt(path, states.SUCCEEDED, first=_implied()).revision == 3


def test_a_record_published_first_is_advanced_not_overwritten(tmp_path: Path,
                                                              monkeypatch) -> None:
    from synthbatch.agent_stdlib import attempts

    path = tmp_path / "attempt-0001" / "attempt.json"
    real = attempts.publish_json_immutable

    def cancel_got_there_first(target, data):  # a cancel links its record just before us
        real(target, _implied().replace(state="cancelled", revision=2).to_dict())
        return real(target, data)

    monkeypatch.setattr(attempts, "publish_json_immutable", cancel_got_there_first)
    with pytest.raises(TransitionError):
        advance_attempt(path, states.RUNNING, first=_implied())
    assert load_attempt(path).state == "cancelled"  # the other writer's record stands


def test_an_illegal_edge_from_the_implied_revision_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "attempt-0001" / "attempt.json"
    with pytest.raises(TransitionError):
        advance_attempt(path, states.SUCCEEDED, first=_implied())
    assert not path.parent.exists()


def test_locked_blocks_tries_once_or_waits_a_while(tmp_path: Path) -> None:
    """The one lock of the tree (six hand-written flock helpers before)."""
    from synthbatch.agent_stdlib.statefile import locked

    path = tmp_path / "x.lock"
    with locked(path) as fd:
        assert fd is not None and oct(path.stat().st_mode & 0o777) == "0o600"
        with locked(path, wait_s=0) as other:  # another descriptor: flock is per open file
            assert other is None
        with locked(path, wait_s=0.2) as other:  # polled until the deadline, then None
            assert other is None
    with locked(path, wait_s=0) as fd:
        assert fd is not None  # released when the block ended
    link = tmp_path / "link.lock"
    link.symlink_to(path)
    with pytest.raises(OSError):
        with locked(link):
            pass
