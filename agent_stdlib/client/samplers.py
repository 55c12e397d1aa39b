"""Sampler columns: values drawn from a record's own random bits.

Every sampled value is a function of (seed, column name, record index) only: the bits of
a cell are the SHA-256 of those three (:func:`cell_bits`; never Python's randomized
``hash()``), so the same seed gives the same records in every process, shard, resume and
retry, whatever order the records are generated in. A cell's 32 bytes give up to four
uniform numbers in [0, 1) with 53 bits each.
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import math
import unicodedata
import uuid
from itertools import accumulate
from typing import Any, Callable, Dict, List, Mapping

from ..recipe.kinds import MIXTURE_WEIGHT, default
from ..recipe.names import LOCALES, SEXES
from ..recipe.template import show

Values = Mapping[str, Any]
Sampler = Callable[[bytes, Values], Any]  # (cell bits, the record's values so far) -> value
UNITS = {"day": 86400, "hour": 3600, "minute": 60, "second": 1}


def cell_bits(seed: int, column: str, index: int) -> bytes:
    """The 32 random bytes of one cell."""
    return hashlib.sha256(f"{seed}\x00{column}\x00{index}".encode()).digest()


def uniform(bits: bytes, k: int = 0) -> float:
    """The ``k``-th (0..3) uniform number in [0, 1) of a cell."""
    return (int.from_bytes(bits[7 * k:7 * k + 7], "big") >> 3) / float(1 << 53)


def pick(n: int, u: float) -> int:
    """An index in 0 .. n-1 from a uniform number ``u``."""
    return min(n - 1, int(u * n))


def _round(value: float, decimals: Any) -> float:
    return value if decimals is None else round(value, int(decimals))


def category(params: Dict[str, Any]) -> Sampler:
    """One of ``values``, weighted by ``weights`` when given."""
    values = list(params["values"])
    weights = params.get("weights")
    if not weights:
        return lambda bits, _: values[pick(len(values), uniform(bits))]
    bounds = list(accumulate(float(w) for w in weights))
    total = bounds[-1]
    return lambda bits, _: values[min(len(values) - 1,
                                      bisect.bisect_right(bounds, uniform(bits) * total))]


def subcategory(params: Dict[str, Any]) -> Sampler:
    """One of ``values[<the category's value>]``."""
    parent, choices = str(params["category"]), dict(params["values"])

    def draw(bits: bytes, values: Values) -> Any:
        options = choices[show(values[parent])]
        return options[pick(len(options), uniform(bits))]
    return draw


def uniform_float(params: Dict[str, Any]) -> Sampler:
    """A float in [low, high)."""
    low, high, decimals = float(params["low"]), float(params["high"]), params.get("decimals")
    return lambda bits, _: _round(low + (high - low) * uniform(bits), decimals)


def gaussian(params: Dict[str, Any]) -> Sampler:
    """A normal variate (Box-Muller from two of the cell's uniform numbers)."""
    mean, stddev = float(params["mean"]), float(params["stddev"])
    decimals = params.get("decimals")

    def draw(bits: bytes, _: Values) -> float:
        radius = math.sqrt(-2.0 * math.log(1.0 - uniform(bits, 0)))
        return _round(mean + stddev * radius * math.cos(2 * math.pi * uniform(bits, 1)),
                      decimals)
    return draw


def integer(params: Dict[str, Any]) -> Sampler:
    """An integer in low .. high, both included."""
    low, high = int(params["low"]), int(params["high"])
    return lambda bits, _: low + pick(high - low + 1, uniform(bits))


def bernoulli(params: Dict[str, Any]) -> Sampler:
    """True with probability ``p``."""
    p = float(params["p"])
    return lambda bits, _: uniform(bits) < p


def uuid4(params: Dict[str, Any]) -> Sampler:
    """A version-4 UUID made of the cell's bits."""
    return lambda bits, _: str(uuid.UUID(bytes=bits[:16], version=4))


def moment(params: Dict[str, Any]) -> Sampler:
    """A moment in [start, end), a whole number of ``unit`` after start."""
    start = dt.datetime.fromisoformat(params["start"])
    end = dt.datetime.fromisoformat(params["end"])
    unit = params.get("unit", default("datetime", "unit"))
    step = UNITS[unit]
    steps = max(1, math.ceil((end - start).total_seconds() / step))
    fmt = params.get("format")

    def draw(bits: bytes, _: Values) -> str:
        when = start + dt.timedelta(seconds=step * pick(steps, uniform(bits)))
        if fmt:
            return when.strftime(fmt)
        return when.date().isoformat() if unit == "day" else when.isoformat()
    return draw


def _inverse(u: float, log_pmf: Callable[[int], float], last: int) -> int:
    """The smallest k in 0 .. last whose cumulative probability exceeds ``u``."""
    total = 0.0
    for k in range(last + 1):
        total += math.exp(log_pmf(k))
        if total > u:
            return k
    return last


def poisson(params: Dict[str, Any]) -> Sampler:
    """A Poisson count with mean ``mean`` (inversion of one uniform number)."""
    mean = float(params["mean"])
    last = int(mean + 60 * math.sqrt(mean) + 60)

    def log_pmf(k: int) -> float:
        return k * math.log(mean) - mean - math.lgamma(k + 1)
    return lambda bits, _: _inverse(uniform(bits), log_pmf, last)


def binomial(params: Dict[str, Any]) -> Sampler:
    """Successes in ``n`` trials of probability ``p`` (inversion of one uniform number)."""
    n, p = int(params["n"]), float(params["p"])
    if p in (0.0, 1.0):
        return lambda bits, _: int(n * p)
    log_choose = math.lgamma(n + 1)

    def log_pmf(k: int) -> float:
        return (log_choose - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                + k * math.log(p) + (n - k) * math.log1p(-p))
    return lambda bits, _: _inverse(uniform(bits), log_pmf, n)


def timedelta(params: Dict[str, Any]) -> Sampler:
    """The ``reference`` column's moment plus a whole number of ``unit`` in
    [dt_min, dt_max): ISO 8601 text (a date when the reference is a date and the unit a
    day); ``null`` when the reference is ``null``."""
    low, high = int(params["dt_min"]), int(params["dt_max"])
    step = UNITS[params.get("unit", default("timedelta", "unit"))]
    reference = str(params["reference"])

    def draw(bits: bytes, values: Values) -> Any:
        base = values.get(reference)
        if base is None:
            return None
        when = dt.datetime.fromisoformat(str(base))
        offset = dt.timedelta(seconds=step * (low + pick(high - low, uniform(bits))))
        if len(str(base)) == 10 and step == UNITS["day"]:
            return (when + offset).date().isoformat()
        return (when + offset).isoformat()
    return draw


def _ascii(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(c for c in folded.lower() if c.isalnum())


def identity(params: Dict[str, Any]) -> Sampler:
    """A person-like value ``{first_name, last_name, sex, age, locale, city, state,
    email}`` from the bundled lists of ``locale`` (``recipe/names.py``) or the recipe's
    own ``first_names``/``last_names``/``places``; emails use reserved example domains."""
    locale = str(params.get("locale", default("identity", "locale")))
    bundled = LOCALES[locale]
    sexes = [str(params["sex"])] if params.get("sex") else list(SEXES)
    firsts: Dict[str, List[str]] = {s: list(params.get("first_names") or bundled[s])
                                    for s in SEXES}
    lasts = list(params.get("last_names") or bundled["last"])
    places = [tuple(p) for p in (params.get("places") or bundled["places"])]
    domains = list(bundled["domains"])
    low, high = (int(x) for x in params.get("age_range", default("identity", "age_range")))

    def draw(bits: bytes, _: Values) -> Dict[str, Any]:
        more = hashlib.sha256(bits + b"\x00identity").digest()
        sex = sexes[pick(len(sexes), uniform(bits, 0))]
        first = firsts[sex][pick(len(firsts[sex]), uniform(bits, 1))]
        last = lasts[pick(len(lasts), uniform(bits, 2))]
        city, state = places[pick(len(places), uniform(bits, 3))]
        number = pick(100, uniform(more, 2))
        return {"first_name": first, "last_name": last, "sex": sex,
                "age": low + pick(high - low + 1, uniform(more, 0)), "locale": locale,
                "city": city, "state": state,
                "email": f"{_ascii(first)}.{_ascii(last)}{number}@"
                         f"{domains[pick(len(domains), uniform(more, 1))]}"}
    return draw


def mixture(params: Dict[str, Any]) -> Sampler:
    """One of ``components`` (each a sampler's ``type`` and parameters, with a
    ``weight``), picked by weight; the component draws from bits of its own."""
    parts = [SAMPLERS[c["type"]]({k: v for k, v in c.items() if k not in ("type", "weight")})
             for c in params["components"]]
    bounds = list(accumulate(float(c.get("weight", MIXTURE_WEIGHT)) for c in params["components"]))

    def draw(bits: bytes, values: Values) -> Any:
        i = min(len(parts) - 1, bisect.bisect_right(bounds, uniform(bits, 3) * bounds[-1]))
        return parts[i](hashlib.sha256(bits + f"\x00mixture{i}".encode()).digest(), values)
    return draw


SAMPLERS: Dict[str, Callable[[Dict[str, Any]], Sampler]] = {
    "category": category, "subcategory": subcategory, "uniform": uniform_float,
    "gaussian": gaussian, "integer": integer, "bernoulli": bernoulli, "uuid": uuid4,
    "datetime": moment, "poisson": poisson, "binomial": binomial, "timedelta": timedelta,
    "mixture": mixture, "identity": identity,
}
