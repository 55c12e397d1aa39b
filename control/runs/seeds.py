"""The seed data of a recipe, checked on the login node when the file is visible here.

A seed file that exists here is read once, completely (``agent_stdlib.recipe.seeds``):
missing fields, malformed rows and an empty file fail the plan naming file and line, the
recipe's names are checked against the file's fields, and the plan records the row count
(the generator notices a file that changed since). A path that does not exist here is
judged by the login-node checks' one path rule (``control.runs.checks.check_path``): FAIL
when its parent is on the shared filesystem, else left to preflight on the compute node.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.agent_stdlib.recipe.columns import ColumnError
from synthbatch.agent_stdlib.recipe.seeds import SeedError, peek_fields, scan
from synthbatch.control.config.client import GenerateClient
from synthbatch.control.errors import InvalidInput


def check_seed_data(plan: Plan, client: GenerateClient, run_file: Path) -> Plan:
    """``plan`` with its seed data's row count; InvalidInput naming file and line."""
    spec = plan.client
    if spec is None or spec.seed_data is None or not os.path.exists(spec.seed_data.path):
        return plan
    seed = spec.seed_data
    try:
        fields = peek_fields(seed.path)
    except SeedError as err:
        raise InvalidInput(f"{run_file}: client.seed_data.path: {err}") from err
    try:
        client.graph(fields)
    except ColumnError as err:
        raise InvalidInput(f"{run_file}: client.{err}") from err
    try:
        index = scan(seed.path, validate=True, required=seed.fields)
    except SeedError as err:
        raise InvalidInput(f"{run_file}: client.seed_data.path: {err}") from err
    return plan.replace(client=replace(spec, seed_data=replace(seed, rows=index.rows)))
