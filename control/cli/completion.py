"""``synthbatch completion bash|zsh|fish``: the shell's completion script (click's)."""

from __future__ import annotations

import click

from synthbatch.control.cli.common import JSON_META
from synthbatch.control.cli.output import emit_json

PROG = "synthbatch"  # the console script the shell completes (pyproject.toml)
COMPLETE_VAR = "_SYNTHBATCH_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object: {"shell": ..., "script": ...}.')
def completion_cmd(shell: str, as_json: bool) -> None:
    """Print the completion script of SHELL: commands, options, run ids, profile names.

    \b
    bash: eval "$(synthbatch completion bash)"   (in ~/.bashrc)
    zsh:  eval "$(synthbatch completion zsh)"    (in ~/.zshrc)
    fish: synthbatch completion fish > ~/.config/fish/completions/synthbatch.fish
    """
    from click.shell_completion import get_completion_class

    root = click.get_current_context().find_root()
    completer = get_completion_class(shell)
    assert completer is not None  # every name in SHELLS has one
    script = completer(root.command, {}, PROG, COMPLETE_VAR).source()
    if as_json or click.get_current_context().meta.get(JSON_META):
        emit_json({"shell": shell, "script": script})
        return
    click.echo(script)
