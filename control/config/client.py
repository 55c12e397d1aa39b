"""The client of a run: the built-in ``generate`` or the user's command in a client image."""

from __future__ import annotations

from typing import Annotated, Dict, List, Optional, Union

from pydantic import Discriminator, Field, Tag, model_validator

from control.config.deployment import (
    EnvValue,
    check_env,
    check_paths,
    check_placeholders,
    placeholders,
)
from control.config.fields import EnvName, Name, Strict, Text
from control.secrets import check_args

PROMPT_FIELDS = frozenset({"index"})
CLIENT_PLACEHOLDERS = frozenset({"python", "config_dir"})


class GenerateClient(Strict):
    """The built-in client: one chat completion per record index."""

    model: Name
    prompt_template: Text
    system_prompt: Optional[Text] = None
    max_tokens: int = Field(default=256, ge=1, le=131072)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    concurrency: int = Field(default=8, ge=1, le=4096)
    max_retries: int = Field(default=5, ge=0, le=100)
    request_timeout_s: float = Field(default=600.0, gt=0)
    image: Optional[Name] = None  # a client image the generator runs in (its python3)

    @model_validator(mode="after")
    def _template(self) -> GenerateClient:
        try:
            used = placeholders(self.prompt_template)
        except ValueError as err:
            raise ValueError(f"prompt_template: {err}") from err
        unknown = sorted(set(used) - PROMPT_FIELDS)
        if unknown:
            raise ValueError(f"prompt_template: unknown placeholder {{{unknown[0]}}} "
                             f"(allowed: {{index}})")
        return self


class CommandClient(Strict):
    """A user client: ``command`` runs once per shard, optionally in a client image.

    It finds the deployments in ``SYNTHBATCH_ENDPOINTS`` and writes JSONL files under
    ``SYNTHBATCH_OUTPUT_DIR`` (records ``SYNTHBATCH_RECORD_OFFSET`` onwards).
    """

    command: List[Text] = Field(min_length=1)
    image: Optional[Name] = None
    env: Dict[EnvName, EnvValue] = {}

    @model_validator(mode="after")
    def _valid(self) -> CommandClient:
        check_placeholders("command", self.command, CLIENT_PLACEHOLDERS)
        try:
            check_args(self.command)
        except ValueError as err:
            raise ValueError(f"command{err}") from err
        check_paths("command", self.command)
        check_env(self.env)
        return self


def _client_kind(value: object) -> str:
    if isinstance(value, CommandClient) or (isinstance(value, dict) and "command" in value):
        return "<command>"
    return "<generate>"


Client = Annotated[Union[Annotated[GenerateClient, Tag("<generate>")],
                         Annotated[CommandClient, Tag("<command>")]],
                   Discriminator(_client_kind)]
