"""The ``synthbatch`` command line: a thin shell over ``control.api``.

Commands live one module per group and are imported only when used (``--help`` reads the
short help from the registry below), so start-up stays cheap.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import click

from synthbatch.control.cli.common import SuggestingGroup, group_json
from synthbatch.control.cli.output import emit_error, emit_json
from synthbatch.control.errors import InvalidInput

CONTEXT = {"help_option_names": ["-h", "--help"]}  # inherited by every subcommand

# name -> (module, attribute, short help)
COMMANDS: Dict[str, Tuple[str, str, str]] = {
    "plan": (".plan", "plan_cmd", "Validate and resolve a run file (dry run)."),
    "preview": (".preview", "preview_cmd",
                "A few records of a run file's recipe, made here against your endpoints."),
    "submit": (".submit", "submit_cmd", "Submit a run file; print the run id."),
    "status": (".status", "status_cmd",
               "Shards by state, records, rate, ETA, failures (--watch)."),
    "runs": (".runs", "runs_cmd", "List the runs of the workspace, newest first."),
    "wait": (".wait", "wait_cmd",
             "Wait until a run ends; exit 0 only if every shard succeeded."),
    "logs": (".logs", "logs_cmd", "Print or follow a shard's log."),
    "cancel": (".cancel", "cancel_cmd", "Cancel a run or some of its shards."),
    "merge": (".merge", "merge_cmd", "Concatenate the verified winners of a run."),
    "retry": (".retry", "retry_cmd", "Submit the next attempt of failed shards."),
    "profile": (".profile", "profile_group", "Create, check and show profiles."),
    "image": (".image", "image_group", "Register sealed container images."),
    "completion": (".completion", "completion_cmd",
                   "Print the shell completion script (bash, zsh, fish)."),
    "benchmark": (".benchmark", "benchmark_group",
                  "Sweep deployment cases x concurrency; analyze; report with charts."),
}


class LazyGroup(SuggestingGroup):
    """A group whose commands are imported on first use; usage errors honour ``--json``."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        """Every registered command name."""
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        """Import the command's module when it is asked for."""
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        module, attribute, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module, __package__), attribute)
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List commands with the registry's short help, importing nothing."""
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args: Optional[Sequence[str]] = None, **extra: Any) -> Any:
        """With ``--json``, a usage error is ``{"error": ...}`` on stderr (exit 2)."""
        argv = list(sys.argv[1:] if args is None else args)
        if "--json" not in argv:
            return super().main(args=argv, **extra)
        if "--version" in argv and set(argv) <= {"--version", "--json"}:
            from importlib.metadata import version

            emit_json({"version": version("synthbatch")})
            sys.exit(0)
        extra.pop("standalone_mode", None)
        try:
            return super().main(args=argv, standalone_mode=False, **extra)
        except click.exceptions.Exit as err:
            sys.exit(err.exit_code)
        except click.Abort:
            sys.exit(1)
        except click.ClickException as err:
            sys.exit(emit_error(InvalidInput(err.format_message()), True))


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(package_name="synthbatch")
@group_json
def cli() -> None:
    """Run large LLM synthetic-data generation jobs on Slurm."""


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="synthbatch")
