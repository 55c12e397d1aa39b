"""Which failures a restart inside the allocation cures, and the bound (pure functions)."""

from __future__ import annotations

import pytest

from synthbatch.agent_stdlib.allocation.restarts import (
    Budget,
    Failure,
    classify,
    server_key,
    server_of,
)
from synthbatch.agent_stdlib.contracts import EXIT_CLIENT_CONFIG, restarts_text


@pytest.mark.parametrize("failure, restart", [
    (Failure(-9), ("client",)),  # killed (OOM killer, kill -9)
    (Failure(137), ("client",)),  # srun's status of a task killed by SIGKILL
    (Failure(1, client_cause="generate: record 3: column completion: HTTP 500: boom"),
     ("client",)),
    (Failure(1, client_cause="HTTP 429: too many requests waiting"), ("client",)),
    (Failure(1, client_cause="HTTP 408: request timeout"), ("client",)),
    (Failure(75), ("client",)),  # stopped by a signal the agent did not send
    (Failure(None, ("server gen/0",)), ("server gen/0", "client")),  # crashed, client runs
    (Failure(1, ("server gen/0", "server judge/1")),
     ("server gen/0", "server judge/1", "client")),
])
def test_failures_a_restart_can_cure(failure: Failure, restart: tuple) -> None:
    verdict = classify(failure)
    assert verdict.curable and verdict.restart == restart


@pytest.mark.parametrize("failure, words", [
    (Failure(EXIT_CLIENT_CONFIG, client_cause="generate: column x: unknown column {nope}"),
     "configuration is wrong"),
    (Failure(1, client_cause="generate: record 0: column c: HTTP 404: model 'big' does not "
                             "exist"), "HTTP 404"),
    (Failure(1, client_cause="HTTP 400: max_tokens too large"), "HTTP 400"),
    (Failure(1, unrestartable=True), "has not ended"),
    (Failure(0), "did not fail"),
])
def test_failures_a_restart_cannot_cure(failure: Failure, words: str) -> None:
    verdict = classify(failure)
    assert not verdict.curable and verdict.restart == () and words in verdict.why


def test_a_server_that_ended_outweighs_the_clients_own_exit_status() -> None:
    # the client exits 2 only because its server went away: the server is the cause
    verdict = classify(Failure(EXIT_CLIENT_CONFIG, (server_key("gen", 0),)))
    assert verdict.restart == ("server gen/0", "client")


def test_the_bound_counts_restarts_and_zero_turns_them_off() -> None:
    assert not Budget(0).allows()
    budget = Budget(2)
    assert budget.allows()
    budget.spend(("client",))
    assert budget.allows()
    budget.spend(("server gen/0", "client"))
    assert not budget.allows() and budget.used == 2
    assert budget.counts == {"client": 2, "server gen/0": 1}


def test_the_counters_read_client_first_then_servers_by_name() -> None:
    assert restarts_text({"server judge/0": 1, "client": 2, "server gen/1": 3}) == \
        "client 2, server gen/1 3, server judge/0 1"
    assert restarts_text({}) == ""


def test_a_server_key_names_its_alias_and_replica() -> None:
    assert server_of(server_key("gen.big", 3)) == ("gen.big", 3)
    assert server_of("client") is None
