"""examples/product-reviews.toml (Data Designer's tutorial "The Basics"): it plans, and the
generator runs it against the fake server; and the new column kinds inside a generator
run (llm-code's language in ``_meta``, validation values other columns use)."""

from __future__ import annotations

from pathlib import Path

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.contracts import ColumnSpec
from synthbatch.agent_stdlib.recipe.columns import IDENTITY_FIELDS
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.agent_runs import produce, recipe_plan, records
from tests.conftest import REPO
from tests.fakes import profile_data

EXAMPLE = REPO / "examples" / "product-reviews.toml"


def plan_example(tmp_path: Path):  # type: ignore[no-untyped-def]
    config = load_model(EXAMPLE, RunConfig)
    return make_plan(config, Profile.model_validate(profile_data()),
                     "product-reviews-20240101-000000-abcdef", tmp_path)


def test_the_product_reviews_example_plans(tmp_path: Path) -> None:
    spec = plan_example(tmp_path).client
    assert spec is not None
    kinds = {c.name: c.type for c in spec.columns}
    assert kinds["customer"] == "identity" and kinds["product_price"] == "uniform"
    assert kinds["customer_review"] == "llm-text"
    assert kinds["review_analysis"] == "llm-structured"
    assert "Data Designer" in EXAMPLE.read_text() and "The Basics" in EXAMPLE.read_text()


PRICES = {"Electronics": (50, 2000), "Books": (5, 60), "Clothing": (15, 300)}


def test_the_product_reviews_example_runs_on_the_fake_server(tmp_path: Path) -> None:
    plan = plan_example(tmp_path)
    with serve_in_thread(model="fake-model") as server:
        written, _ = produce(plan, {"text": server.url}, tmp_path / "out")
    rows = records(tmp_path / "out")
    assert written == len(rows) == plan.total_records
    for row in rows:
        assert "_error" not in row
        assert tuple(row["customer"]) == IDENTITY_FIELDS
        assert 18 <= row["customer"]["age"] <= 70
        low, high = PRICES.get(row["product_category"], (10, 1000))  # conditional params
        assert low <= row["product_price"] < high
        assert row["review_analysis"]["sentiment"] in ("positive", "neutral", "negative")
        assert isinstance(row["customer_review"], str) and row["customer_review"]


CODE_COLUMNS = (
    ColumnSpec("code", "llm-code", {"model": "gen", "prompt": "Write code #{index}",
                                    "max_tokens": 8}),
    ColumnSpec("parses", "validation", {"validator": "python", "target": "code"}),
    ColumnSpec("digits", "validation", {"validator": "regex", "target": "code",
                                        "pattern": "^[0-9]+$", "on_invalid": "error"}),
    ColumnSpec("label", "expression", {"template": "{parses.valid}"}),
)


def test_validation_values_feed_templates_and_on_invalid_fails_the_record(
        tmp_path: Path) -> None:
    plan = recipe_plan(CODE_COLUMNS, records=6, on_error="keep", max_retries=0)
    with serve_in_thread(model="fake-model") as server:
        produce(plan, {"gen": server.url}, tmp_path / "out")
    rows = records(tmp_path / "out")
    assert len(rows) == 6
    for row in rows:
        meta = row["_meta"]["columns"]["code"]
        assert meta["language"] is None  # the fake server's words have no fence
        parses = row["parses"]
        assert parses == {"valid": parses["valid"], "errors": parses["errors"]}
        assert row["label"] == ("true" if parses["valid"] else "false")
        assert row["digits"] is None  # words are not digits: on_invalid = "error"
        assert row["_error"]["column"] == "digits"
        assert row["_error"]["message"].startswith("invalid: does not match")
