"""The client of a run: the built-in ``generate``, the user's command in a client image, or
a NeMo Data Designer config (``data_designer``, run by the agent's ``dd`` role)."""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from synthbatch.agent_stdlib.contracts import split_dd_config
from synthbatch.agent_stdlib.recipe.columns import ColumnError, Graph, Node, analyze
from synthbatch.control.config.columns import Column, LLMColumn, category_problem
from synthbatch.control.config.deployment import (
    EnvValue,
    check_env,
    check_paths,
    check_placeholders,
    placeholders,
)
from synthbatch.control.config.fields import ConfigPath, EnvName, Name, Prompt, Strict, Text
from synthbatch.control.config.rules import check_text
from synthbatch.control.secrets import check_args

PROMPT_FIELDS = frozenset({"index"})
CLIENT_PLACEHOLDERS = frozenset({"python", "config_dir"})


class SeedData(Strict):
    """A JSONL or CSV file on the shared filesystem; each record takes one of its rows."""

    path: ConfigPath
    order: Literal["in-order", "shuffle", "sample"] = "in-order"


LEGACY = ("model", "prompt_template", "system_prompt", "max_tokens", "temperature")


class GenerateClient(Strict):
    """The built-in generator: a recipe of ``columns``, or one ``prompt_template``.

    ``docs/generator.md`` describes both; the prompt-template form is one chat completion
    per record index (``{index}`` is its only placeholder).
    """

    model: Optional[Name] = None
    prompt_template: Optional[Text] = None
    system_prompt: Optional[Prompt] = None
    max_tokens: int = Field(default=256, ge=1, le=131072)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    columns: Optional[List[Column]] = Field(default=None, min_length=1, max_length=256)
    context: Optional[Prompt] = None  # first in every LLM request of a record
    seed_data: Optional[SeedData] = None
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    on_error: Literal["fail", "drop", "keep"] = "fail"
    concurrency: Optional[int] = Field(default=None, ge=1, le=4096)
    max_retries: int = Field(default=5, ge=0, le=100)
    request_timeout_s: float = Field(default=600.0, gt=0)
    image: Optional[Name] = None  # a client image the generator runs in (its python3)

    @model_validator(mode="after")
    def _form(self) -> GenerateClient:
        if self.columns is None:
            return self._template_form()
        for name in LEGACY:
            if name in self.model_fields_set:
                raise ValueError(f"{name}: belongs to the prompt_template form; with columns, "
                                 f"set it on each LLM column")
        problem = category_problem(self.columns)
        if problem:
            raise ValueError(problem)
        try:
            self.graph()
        except ColumnError as err:
            raise ValueError(str(err)) from err
        return self

    def _template_form(self) -> GenerateClient:
        for name in ("model", "prompt_template"):
            if getattr(self, name) is None:
                raise ValueError(f"{name}: required (or give columns)")
        if self.seed_data is not None:
            raise ValueError("seed_data: needs columns (the prompt_template form has only "
                             "{index})")
        if self.context is not None:
            raise ValueError("context: needs columns (the prompt_template form has "
                             "system_prompt)")
        assert self.prompt_template is not None
        try:
            used = placeholders(self.prompt_template)
        except ValueError as err:
            raise ValueError(f"prompt_template: {err}") from err
        unknown = sorted(set(used) - PROMPT_FIELDS)
        if unknown:
            raise ValueError(f"prompt_template: unknown placeholder {{{unknown[0]}}} "
                             f"(allowed: {{index}})")
        return self

    def nodes(self) -> List[Node]:
        """The recipe's columns as the graph sees them."""
        return [c.node() for c in self.columns or ()]

    def graph(self, seed_fields: Optional[Sequence[str]] = None) -> Graph:
        """The checked recipe (ColumnError when it does not fit together)."""
        return analyze(self.nodes(), seed_fields, has_seed=self.seed_data is not None,
                       context=self.context)

    def aliases(self) -> List[Tuple[str, str]]:
        """(field path, alias) of every model the client talks to."""
        if self.columns is None:
            return [("model", str(self.model))]
        return [(f"columns[{i}].model", c.model) for i, c in enumerate(self.columns)
                if isinstance(c, LLMColumn)]


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
