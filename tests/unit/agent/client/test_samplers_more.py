"""The timedelta, mixture and identity samplers: functions of (seed, column, index) only,
with the distributions they promise."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, Dict

from synthbatch.agent_stdlib.client.samplers import SAMPLERS, cell_bits
from synthbatch.agent_stdlib.recipe.columns import IDENTITY_FIELDS
from synthbatch.agent_stdlib.recipe.names import LOCALES


def draw(kind: str, params: Dict[str, Any], index: int, values: Any = None,
         seed: int = 1) -> Any:
    return SAMPLERS[kind](params)(cell_bits(seed, "col", index), values or {})


def test_timedelta_offsets_the_reference_by_whole_units_in_range() -> None:
    params = {"dt_min": 1, "dt_max": 4, "unit": "day", "reference": "start"}
    ends = [draw("timedelta", params, i, {"start": "2024-03-01"}) for i in range(300)]
    assert set(ends) == {"2024-03-02", "2024-03-03", "2024-03-04"}  # dt_max excluded
    hours = draw("timedelta", dict(params, unit="hour"), 5, {"start": "2024-03-01T10:00:00"})
    offset = dt.datetime.fromisoformat(hours) - dt.datetime(2024, 3, 1, 10)
    assert offset in {dt.timedelta(hours=h) for h in (1, 2, 3)}
    assert draw("timedelta", params, 0, {"start": None}) is None
    assert ends == [draw("timedelta", params, i, {"start": "2024-03-01"}) for i in range(300)]


def test_mixture_picks_components_by_weight_with_their_own_parameters() -> None:
    params = {"components": [
        {"type": "integer", "weight": 3.0, "low": 0, "high": 9},
        {"type": "category", "weight": 1.0, "values": ["x"]}]}
    values = [draw("mixture", params, i) for i in range(2000)]
    share = sum(v == "x" for v in values) / len(values)
    assert 0.2 < share < 0.3
    assert {v for v in values if v != "x"} == set(range(10))
    assert values == [draw("mixture", params, i) for i in range(2000)]


def test_identity_draws_from_the_bundled_lists_deterministically() -> None:
    params = {"locale": "de_DE", "age_range": [30, 32]}
    people = [draw("identity", params, i) for i in range(400)]
    assert all(tuple(p) == IDENTITY_FIELDS for p in people)
    bundled = LOCALES["de_DE"]
    assert {p["last_name"] for p in people} == set(bundled["last"])
    assert {p["age"] for p in people} == {30, 31, 32}
    assert Counter(p["sex"] for p in people).keys() == {"female", "male"}
    for person in people:
        assert person["first_name"] in bundled[person["sex"]]
        assert (person["city"], person["state"]) in bundled["places"]
        local, domain = person["email"].split("@")
        assert local.isascii() and domain in bundled["domains"]
    assert people == [draw("identity", params, i) for i in range(400)]
    assert people != [draw("identity", params, i, seed=2) for i in range(400)]


def test_identity_uses_the_recipes_own_lists_and_sex() -> None:
    params = {"sex": "female", "first_names": ["Ada"], "last_names": ["Lovelace"],
              "places": [["London", "England"]]}
    person = draw("identity", params, 3)
    assert (person["first_name"], person["last_name"], person["sex"], person["city"],
            person["state"]) == ("Ada", "Lovelace", "female", "London", "England")
    assert person["email"].startswith("ada.lovelace")
