"""The one wrapper every command goes through: common options, output, exit codes."""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, List

import click

from synthbatch.control.cli.output import emit_error, emit_json, emit_text

F = Callable[..., Any]
JSON_META = "synthbatch.json"  # ctx.meta key: a group was given --json


def group_json(func: F) -> F:
    """``--json`` on a group, before its command: that command prints JSON as if it had
    been given its own ``--json`` (a group given no command answers with a JSON error)."""
    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            ctx.meta[JSON_META] = True
        return value

    return click.option("--json", "as_json", is_flag=True, expose_value=False,
                        callback=remember, help="Print one JSON object.")(func)


def common(func: F) -> F:
    """Add ``--profile``, ``--json`` and ``--debug``; map errors to exit codes once.

    The command returns ``{"data": ..., "text": ...}`` (printed as JSON or text; with
    ``"colour": True`` the text's states are coloured on a terminal), or None when it
    printed its own output (``--watch``, ``--follow``); a command that declares an
    ``as_json`` parameter receives the flag.
    """

    wants_json = "as_json" in inspect.signature(func).parameters

    @click.option("--profile", "profile", default=None, shell_complete=complete_profile,
                  help="Profile name or path (default: $SYNTHBATCH_PROFILE, then 'default').")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    @click.option("--debug", is_flag=True, help="Show tracebacks.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, debug: bool, **kwargs: Any) -> None:
        as_json = as_json or click.get_current_context().meta.get(JSON_META, False)
        if wants_json:
            kwargs["as_json"] = as_json
        try:
            result = func(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the one place errors become exit codes
            if debug:
                raise
            sys.exit(emit_error(err, as_json))
        if result is None:
            return
        if as_json:
            emit_json(result["data"])
        else:
            emit_text(result["text"], colour=result.get("colour", False))

    return wrapper


class SuggestingGroup(click.Group):
    """A group that answers an unknown command with the closest known ones."""

    def resolve_command(self, ctx: click.Context, args: List[str]) -> Any:
        """Raise a usage error naming the closest commands for a name that is not one."""
        name = args[0] if args else ""
        if args and not name.startswith("-") and not ctx.resilient_parsing \
                and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise click.UsageError(f"No such command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)


# ----------------------------------------------------------------------------- completion
# Shell completion runs these on every <TAB>: they never raise and never ask Slurm.


def complete_profile(ctx: click.Context, param: click.Parameter, incomplete: str) -> List[Any]:
    """Profile names from ``~/.config/synthbatch/profiles``; a path completes as a file."""
    from click.shell_completion import CompletionItem

    if "/" in incomplete or incomplete.startswith((".", "~")):
        return [CompletionItem(incomplete, type="file")]
    from synthbatch.control.readapi import PROFILE_DIR

    try:
        names = sorted(n[:-5] for n in os.listdir(PROFILE_DIR.expanduser())
                       if n.endswith(".toml"))
    except OSError:
        names = []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_run_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> List[Any]:
    """Run ids of the workspace of the ``--profile`` typed so far (or the default one),
    newest first (as ``runs`` lists them)."""
    from click.shell_completion import CompletionItem

    from synthbatch.control.readapi import committed_run_ids, load_workspace_profile

    try:
        workspace = load_workspace_profile(ctx.params.get("profile")).workspace
        names = committed_run_ids(Path(workspace))
    except Exception:  # noqa: BLE001 - no profile, no workspace: nothing to offer
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def run_id_argument(required: bool = True) -> Callable[[F], F]:
    """The ``RUN_ID`` argument of the run commands (completed from the workspace)."""
    return click.argument("run_id", required=required, shell_complete=complete_run_id)


def slurm_overrides(func: F) -> F:
    """``-p/--partition``, ``-A/--account``, ``-q/--qos``, ``-t/--time``, ``--reservation``:
    the profile's fields people change per run, as sbatch spells them."""
    for names, dest, what in ((("--reservation",), "reservation", "Slurm reservation."),
                              (("-t", "--time"), "time_limit",
                               "Time limit per shard ([D-]HH:MM:SS or minutes); beats the "
                               "run file's resources.time_limit."),
                              (("-q", "--qos"), "qos", "Slurm QOS."),
                              (("-A", "--account"), "account", "Slurm account."),
                              (("-p", "--partition"), "partition", "Slurm partition.")):
        func = click.option(*names, dest, default=None,
                            help=f"{what} Overrides the profile.")(func)
    func = click.option("--pilot", "pilot", default=None, metavar="BENCHMARK_ID",
                        help="A finished `synthbatch benchmark` of the same models: the "
                             "automatic layout's split and the deadline's throughput from "
                             "its measurements; beats resources.pilot.")(func)
    func = click.option("--deadline", "deadline_hours", type=float, default=None,
                        metavar="HOURS",
                        help="Hours the whole run may take: shards from the pilot's "
                             "throughput; beats resources.deadline_hours.")(func)
    return click.option("--gpus", "gpus", type=int, default=None,
                        help="GPU budget per allocation for the automatic layout; beats "
                             "the run file's resources.gpus.")(func)
