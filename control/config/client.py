"""The client of a run: the built-in ``generate``, the user's command in a client image, or
a NeMo Data Designer config (``data_designer``, run by the agent's ``dd`` role)."""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Optional, Union

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from agent_stdlib.contracts import split_dd_config
from control.config.deployment import (
    EnvValue,
    check_env,
    check_paths,
    check_placeholders,
    placeholders,
)
from control.config.fields import ConfigPath, EnvName, Name, Strict, Text
from control.config.rules import check_text
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


DD_SUFFIXES = (".yaml", ".yml", ".json")
# Data Designer RunConfig fields synthbatch sets itself (docs/data-designer.md).
DD_RESERVED_RUN_CONFIG = {"otel_metrics_port": "synthbatch turns Data Designer's metrics "
                          "endpoint off: several clients may share a node"}
RUN_CONFIG_TYPES = (bool, int, float, str)


class DataDesignerClient(Strict):
    """A NeMo Data Designer config, run once per shard by the agent's ``dd`` role under
    ``python`` (an environment with ``data-designer`` installed) or inside ``image``."""

    data_designer: Text
    python: Optional[ConfigPath] = None
    image: Optional[Name] = None
    models: Dict[Name, Name] = {}  # Data Designer model alias -> deployment alias
    run_config: Dict[Name, Any] = {}
    max_passes: int = Field(default=3, ge=1, le=100)
    env: Dict[EnvName, EnvValue] = {}

    @model_validator(mode="after")
    def _valid(self) -> DataDesignerClient:
        path, function = split_dd_config(self.data_designer)
        try:
            TypeAdapter(ConfigPath).validate_python(path)
        except ValidationError as err:
            message = err.errors()[0]["msg"].removeprefix("Value error, ")
            raise ValueError(f"data_designer: {message}") from err
        if path.endswith(".py"):
            if not function.isidentifier():
                raise ValueError("data_designer: name the function that returns the config "
                                 "builder: 'build.py:builder'")
        elif function or not path.endswith(DD_SUFFIXES):
            raise ValueError("data_designer: expected a Data Designer config file (.yaml, "
                             ".yml, .json) or 'file.py:function'")
        if self.python is None and self.image is None:
            raise ValueError("python: give the Python of an environment with data-designer "
                             "installed (scripts/client-env dd builds one), or an image")
        for key, value in sorted(self.run_config.items()):
            if key in DD_RESERVED_RUN_CONFIG:
                raise ValueError(f"run_config.{key}: {DD_RESERVED_RUN_CONFIG[key]}")
            if not isinstance(value, RUN_CONFIG_TYPES):
                raise ValueError(f"run_config.{key}: expected a boolean, number or string "
                                 "(a Data Designer RunConfig field; tables are not supported)")
            if isinstance(value, str):
                check_text(value)
        check_env(self.env)
        return self


def _client_kind(value: object) -> str:
    if isinstance(value, DataDesignerClient) or (isinstance(value, dict)
                                                 and "data_designer" in value):
        return "<data_designer>"
    if isinstance(value, CommandClient) or (isinstance(value, dict) and "command" in value):
        return "<command>"
    return "<generate>"


Client = Annotated[Union[Annotated[GenerateClient, Tag("<generate>")],
                         Annotated[CommandClient, Tag("<command>")],
                         Annotated[DataDesignerClient, Tag("<data_designer>")]],
                   Discriminator(_client_kind)]
