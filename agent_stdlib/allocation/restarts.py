"""Restarts inside the allocation: which failures a restart cures, and the bound (pure).

When the client step fails while the servers were ready, the controller describes what it
saw as a :class:`Failure` and asks :func:`classify` what to do: restart the client (it
resumes from the records it already wrote), restart the servers that ended and then the
client, or give the attempt up. :class:`Budget` counts the restarts against the run's
``[retries] in_allocation`` bound. No I/O here; ``controller.py`` does the restarting.

Not cured by a restart, so never retried in place: a client that exits with
:data:`~agent_stdlib.contracts.EXIT_CLIENT_CONFIG` (usage, plan, recipe, seed data: its
configuration is wrong), a client whose requests the server refused as the client's fault
(HTTP 4xx other than 408/429: a model that does not exist, a bad request), and any
failure before the servers were ready (preflight, a server that never became ready, such
as an out-of-memory at load). A restarted server that does not become ready again fails
the attempt as a start-up failure does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ..contracts import EXIT_CLIENT_CONFIG, RESTART_CLIENT

CLIENT = RESTART_CLIENT
# "HTTP 404", "HTTP 400" in the client's last error line: the server answered, and said the
# request is wrong; 408 (timeout) and 429 (busy) are the server's state, not the request's
_REFUSED = re.compile(r"\bHTTP (4(?!08|29)\d\d)\b")


def server_key(alias: str, replica: int) -> str:
    """How a server is named in restart counters: ``server gen/0``."""
    return f"server {alias}/{replica}"


def server_of(key: str) -> Optional[Tuple[str, int]]:
    """``(alias, replica)`` of a :func:`server_key`; None for the client."""
    if not key.startswith("server "):
        return None
    alias, _, replica = key[len("server "):].rpartition("/")
    return alias, int(replica)


@dataclass(frozen=True)
class Failure:
    """What ended the client phase of an execution (facts gathered by the controller).

    ``client_code`` is the client's exit status (None: it was still running when a server
    ended); ``servers`` are the :func:`server_key` of the servers that had been ready and
    have ended; ``client_cause`` is the last error line of the client's log, if any;
    ``unrestartable``: a server no longer answers but its step has not ended (a replica
    across nodes whose rank ended), so there is nothing to start again.
    """

    client_code: Optional[int]
    servers: Tuple[str, ...] = ()
    client_cause: Optional[str] = None
    unrestartable: bool = False


@dataclass(frozen=True)
class Verdict:
    """What to restart (servers first, then the client), or nothing and why not."""

    restart: Tuple[str, ...]
    why: str

    @property
    def curable(self) -> bool:
        """True when a restart may cure the failure."""
        return bool(self.restart)


def classify(failure: Failure) -> Verdict:
    """Whether a restart inside the allocation can cure ``failure``, and of what."""
    if failure.unrestartable:
        return Verdict((), "a server stopped answering and its step has not ended")
    if failure.servers:
        # the client depends on them: it is restarted after them (resuming)
        return Verdict(failure.servers + (CLIENT,),
                       f"{', '.join(failure.servers)} ended after it was ready")
    code = failure.client_code
    if code is None or code == 0:
        return Verdict((), "the client did not fail")
    if code == EXIT_CLIENT_CONFIG:
        return Verdict((), f"the client exited with status {code} (its configuration is "
                           "wrong; a restart would fail the same way)")
    refused = _REFUSED.search(failure.client_cause or "")
    if refused:
        return Verdict((), f"the server refused the client's requests (HTTP "
                           f"{refused.group(1)}: a restart would be refused the same way)")
    if code < 0:
        return Verdict((CLIENT,), f"the client was killed by signal {-code}")
    return Verdict((CLIENT,), f"the client exited with status {code} while the servers "
                              "answer")


@dataclass
class Budget:
    """Restarts used inside one allocation, against the run's bound (0: none)."""

    bound: int
    used: int = 0
    counts: Dict[str, int] = field(default_factory=dict)

    def allows(self) -> bool:
        """True while one more restart is within the bound."""
        return self.used < self.bound

    def spend(self, restarted: Tuple[str, ...]) -> None:
        """Count one restart of everything in ``restarted``."""
        self.used += 1
        for name in restarted:
            self.counts[name] = self.counts.get(name, 0) + 1

