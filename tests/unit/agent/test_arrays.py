"""The one home of shard -> array -> task -> job id (agent_stdlib.arrays)."""

from __future__ import annotations

import random

import pytest

from agent_stdlib.arrays import ArrayError, array_job_id, array_task, task_job_id, task_shard
from control.planning.arrays import array_chunks
from control.runs.store import ArrayView


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
