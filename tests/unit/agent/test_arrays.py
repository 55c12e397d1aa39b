"""The one home of shard -> array -> task -> job id (agent_stdlib.arrays)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from synthbatch.agent_stdlib import arrays
from synthbatch.agent_stdlib.arrays import (
    ArrayError,
    array_job_id,
    array_task,
    array_tasks,
    task_job_id,
    task_shard,
)
from synthbatch.control.planning.arrays import array_chunks
from synthbatch.control.runs.status.records import ArrayView
from tests.conftest import REPO


def test_array_task_and_task_shard_invert_each_other_over_random_splits() -> None:
    rng = random.Random(7)
    for _ in range(300):
        shards = rng.randint(1, 400)
        arrays = array_chunks(shards, rng.choice([None, 1, 2, 3, 7, 64, 1000]))
        for shard in range(shards):
            index, task = array_task(arrays, shard)
            assert 0 <= task < arrays[index].count
            assert task_shard(arrays, index, task) == shard
        with pytest.raises(ArrayError):
            array_task(arrays, shards)


def test_examples_of_a_split_run() -> None:
    arrays = array_chunks(25, 10)
    assert array_task(arrays, 0) == (0, 0) and array_task(arrays, 19) == (1, 9)
    assert array_task(arrays, 24) == (2, 4)
    assert task_shard(arrays, 2, 4) == 24
    views = tuple(ArrayView(a.index, a.first_shard, a.count) for a in arrays)
    assert [array_task(views, s) for s in (0, 19, 24)] == [(0, 0), (1, 9), (2, 4)]


def test_a_plan_without_arrays_is_one_array_whose_task_is_the_shard() -> None:
    assert array_task((), 17) == (None, 17)
    assert task_shard((), None, 17) == 17
    one = array_chunks(5)
    assert task_shard(one, None, 3) == 3  # a script rendered before --array-index existed


@pytest.mark.parametrize("index,task,message", [
    (None, 0, "2 arrays and no array index"),
    (5, 0, "array 5: the plan has no such array"),
    (1, 2, "array 1 has 2 task"),
])
def test_task_shard_names_what_is_off(index, task, message) -> None:
    arrays = array_chunks(5, 3)
    with pytest.raises(ArrayError, match=message):
        task_shard(arrays, index, task)


def test_job_ids_of_array_tasks() -> None:
    assert task_job_id("12", 3) == "12_3"
    assert array_job_id("12_3") == "12" and array_job_id("12") == "12"


def test_a_run_sharing_an_array_has_its_tasks_at_an_offset() -> None:
    arrays = array_chunks(4, 10, first_task=6)  # tasks 6-9 of a shared array
    assert [(a.first_shard, a.count, a.first_task) for a in arrays] == [(0, 4, 6)]
    assert [array_task(arrays, s) for s in range(4)] == [(0, 6), (0, 7), (0, 8), (0, 9)]
    assert [task_shard(arrays, 0, t) for t in (6, 9)] == [0, 3]
    for task in (0, 5, 10):  # another run's tasks, or past the end
        with pytest.raises(ArrayError, match="tasks 6-9"):
            task_shard(arrays, 0, task)
    views = tuple(ArrayView(a.index, a.first_shard, a.count, a.first_task) for a in arrays)
    assert array_task(views, 2) == (0, 8)


def test_an_offset_run_larger_than_the_rest_of_the_array_is_split() -> None:
    arrays = array_chunks(7, 4, first_task=2)  # tasks 2-3, then 0-3, then 0
    assert [(a.first_shard, a.count, a.first_task) for a in arrays] == [
        (0, 2, 2), (2, 4, 0), (6, 1, 0)]
    assert [array_task(arrays, s) for s in (0, 1, 2, 6)] == [(0, 2), (0, 3), (1, 0), (2, 0)]
    with pytest.raises(ValueError, match="not below MaxArraySize"):
        array_chunks(3, 4, first_task=4)


def test_array_tasks_answers_as_array_task_for_every_shard_in_any_order() -> None:
    rng = random.Random(11)
    for _ in range(200):
        shards = rng.randint(1, 300)
        size = rng.choice([None, 1, 2, 5, 64, 1000])
        first = rng.choice([0, 6]) if size is None or size > 6 else 0
        arrays = list(array_chunks(shards, size, first_task=first))
        rng.shuffle(arrays)  # the search must not depend on the arrays' order
        asked = list(range(shards))
        rng.shuffle(asked)
        assert list(array_tasks(arrays, asked)) == \
            [(s, *array_task(arrays, s)) for s in asked]
        with pytest.raises(ArrayError, match=f"no array of the plan holds shard {shards}"):
            list(array_tasks(arrays, [0, shards]))
        with pytest.raises(ArrayError):
            list(array_tasks(arrays, [-1]))


def test_array_tasks_without_arrays_is_the_shard_itself() -> None:
    assert list(array_tasks((), [3, 0])) == [(3, None, 3), (0, None, 0)]


@pytest.mark.parametrize(("job_id", "parts"), [("12_3", ("12", 3)), ("12", ("12", None)),
                                               ("4294967295_0", ("4294967295", 0))])
def test_a_job_id_splits_into_its_array_job_and_task(job_id: str, parts: tuple) -> None:
    assert arrays.job_and_task(job_id) == parts
    assert arrays.array_job_id(job_id) == parts[0]
    if parts[1] is not None:
        assert arrays.task_job_id(*parts) == job_id


# ``{a}_{b}`` anywhere in a line (an f-string's two fields joined by ``_``), or a split on
# ``_``: how a task's job id was rebuilt by hand.
JOB_ID_BY_HAND = re.compile(r"""\{[^{}]+\}_\{[^{}]+\}|\.(partition|split)\(["']_["']""")


def test_only_arrays_builds_or_splits_a_task_job_id() -> None:
    """The ``<job>_<task>`` rule has one home (issue 29): no f-string joins two values with
    ``_`` (alone or inside a longer text) and no ``partition("_")`` or ``split("_")``
    outside ``agent_stdlib/arrays.py``, in the code and in the benchmarks."""
    home = Path(arrays.__file__).resolve()
    found = [f"{path.relative_to(REPO)}:{n + 1}"
             for root in ("agent_stdlib", "control", "benchmarks")
             for path in sorted((REPO / root).rglob("*.py")) if path.resolve() != home
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines())
             if JOB_ID_BY_HAND.search(line)]
    assert found == []


def test_the_job_id_scan_sees_every_form() -> None:
    lines = ['x = f"{job}_{task}"', 'f"*** JOB {job.job_id}_{task.task} ended"',
             'job, _, task = text.partition("_")', "a = b.split('_')"]
    assert [bool(JOB_ID_BY_HAND.search(line)) for line in lines] == [True] * 4
    assert not JOB_ID_BY_HAND.search('f"{name}-{index:05d}"')
