"""Who may use what: the request's account, QOS and reservation, checked from the login
node before the queue (``sbatch -A bogus`` is queued and runs as the user's default account
on a cluster that does not enforce associations; ``--reservation nosuch`` is refused only
by ``sbatch``).

Asked through the one Slurm client (``control.slurm.scheduler``): the accounting's
associations of this user and its QOS (``sacctmgr``; on a cluster without accounting the
check says it was skipped), and ``scontrol show reservation``. ``check_request`` is the
one entry ``plan``, ``submit`` and ``profile validate`` share: the partition fit
(``control.runs.fit``) and these.
"""

from __future__ import annotations

import os
import pwd
from typing import List, Optional, Sequence

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.runs.checks import ERROR, NODE, OK, WARNING, Finding
from synthbatch.control.runs.fit import Origins, check_fit
from synthbatch.control.slurm.parsers import Association, Reservation
from synthbatch.control.slurm.scheduler import Scheduler


def login_user() -> str:
    """The name Slurm knows this user by (its uid's)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _have(names: Sequence[str]) -> str:
    return ", ".join(sorted(set(names))) or "none"


def check_account(res: ResourceSpec, assoc: Sequence[Association], user: str,
                  where: str) -> List[Finding]:
    """The account is one of the user's associations (for this partition)."""
    account = res.account
    if not account:
        return []
    mine = [a for a in assoc if a.account == account]
    if not mine:
        return [Finding(ERROR, where, f"{account}: not an account of user {user} (have: "
                                      f"{_have([a.account for a in assoc])})")]
    if res.partition and not any(a.partition in (None, res.partition) for a in mine):
        return [Finding(ERROR, where, f"{account}: user {user}'s association with it is for "
                                      f"partition {_have([str(a.partition) for a in mine])} "
                                      f"only, not {res.partition}")]
    return [Finding(OK, where, f"{account}: an account of user {user}")]


def check_qos(res: ResourceSpec, assoc: Sequence[Association], names: Sequence[str],
              user: str, where: str) -> List[Finding]:
    """The QOS exists, and the user's associations (of the account) allow it."""
    qos = res.qos
    if not qos:
        return []
    if qos not in names:
        return [Finding(ERROR, where, f"{qos}: no such QOS on this cluster (have: "
                                      f"{_have(names)})")]
    mine = [a for a in assoc if not res.account or a.account == res.account]
    allowed = sorted({q for a in mine for q in a.qos})
    if mine and allowed and qos not in allowed:
        whose = f"account {res.account} of user {user}" if res.account else f"user {user}"
        return [Finding(ERROR, where, f"{qos}: not a QOS of {whose} (allowed: "
                                      f"{', '.join(allowed)})")]
    return [Finding(OK, where, f"{qos}: a QOS of user {user}")]


def check_reservation(res: ResourceSpec, reservations: Sequence[Reservation], user: str,
                      where: str) -> List[Finding]:
    """The reservation exists and is open to this user or the job's account."""
    name = res.reservation
    if not name:
        return []
    found = next((r for r in reservations if r.name == name), None)
    if found is None:
        return [Finding(ERROR, where, f"{name}: no such reservation (have: "
                                      f"{_have([r.name for r in reservations])})")]
    account = res.account
    denied = f"-{user}" in found.users or (account and f"-{account}" in found.accounts)
    listed = user in found.users or (account and account in found.accounts)
    open_to_all = not [u for u in found.users if not u.startswith("-")] and \
        not [a for a in found.accounts if not a.startswith("-")]
    if denied or not (listed or open_to_all):
        if not account and found.accounts and not denied:
            return [Finding(WARNING, where, f"{name}: open to account(s) "
                                            f"{', '.join(found.accounts)} only; the job's "
                                            f"default account must be one of them")]
        return [Finding(ERROR, where, f"{name}: not open to user {user}"
                                      + (f" or account {account}" if account else "")
                                      + f" (users: {', '.join(found.users) or 'any'}; "
                                      f"accounts: {', '.join(found.accounts) or 'any'})")]
    if found.state != "ACTIVE":
        return [Finding(WARNING, where, f"{name}: {found.state} until {found.start}: the run "
                                        f"waits for it")]
    return [Finding(OK, where, f"{name}: active, open to user {user}")]


def check_access(res: ResourceSpec, scheduler: Scheduler, origins: Origins,
                 user: str) -> List[Finding]:
    """Account, QOS and reservation; ``node`` level when Slurm cannot be asked."""
    found: List[Finding] = []
    if res.account or res.qos:
        where = origins.account if res.account else origins.qos
        try:
            assoc = scheduler.associations(user)
            names = scheduler.qos_names() if res.qos and assoc is not None else []
        except SchedulerUnavailable as err:
            found.append(Finding(NODE, where, f"account and QOS not checked: {err.message}"))
        else:
            if assoc is None:
                found.append(Finding(OK, where, "account and QOS not checked: this cluster "
                                                "keeps no accounting (no slurmdbd)"))
            else:
                found += check_account(res, assoc, user, origins.account)
                found += check_qos(res, assoc, names or [], user, origins.qos)
    if res.reservation:
        try:
            found += check_reservation(res, scheduler.reservations(), user,
                                       origins.reservation)
        except SchedulerUnavailable as err:
            found.append(Finding(NODE, origins.reservation,
                                 f"{res.reservation}: not checked: {err.message}"))
    return found


def check_request(res: ResourceSpec, scheduler: Scheduler, origins: Optional[Origins] = None,
                  unavailable: Optional[SchedulerUnavailable] = None,
                  user: Optional[str] = None) -> List[Finding]:
    """The request against the cluster: its partition (``check_fit``), then its account,
    QOS and reservation. The one entry of ``plan``, ``submit`` and ``profile validate``."""
    origins = origins or Origins()
    found = check_fit(res, scheduler, origins, unavailable)
    if unavailable is not None or any(f.level == NODE and f.field == origins.partition
                                      for f in found):
        return found  # Slurm did not answer: said once, by check_fit
    return found + check_access(res, scheduler, origins, user or login_user())
