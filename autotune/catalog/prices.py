"""GPU prices per hour: the catalog's defaults (data/prices.yaml) and ``--price`` overrides."""

from __future__ import annotations

import functools
import math
import re
from importlib import resources

import yaml

from autotune.errors import InputError

PRICES_FILE = "prices.yaml"
SECONDS_PER_HOUR = 3600


@functools.cache
def default_prices() -> dict[str, float]:
    """``{catalog GPU: USD per GPU-hour}`` from autotune/catalog/data/prices.yaml."""
    text = resources.files("autotune.catalog").joinpath("data", PRICES_FILE).read_text()
    return {str(gpu): float(usd) for gpu, usd in yaml.safe_load(text).items()}


def parse_prices(texts: list[str]) -> dict[str, float]:
    """``["rtx4080s-32g=0.35"]`` -> ``{"rtx4080s-32g": 0.35}`` (USD per hour)."""
    prices: dict[str, float] = {}
    for text in texts:
        gpu, sep, value = text.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = math.nan
        if not sep or not gpu.strip() or not math.isfinite(usd) or usd <= 0:
            raise InputError(
                f"--price {text!r}: expected GPU=USD_PER_HOUR, the price a finite number > 0 "
                "(e.g. h100=2.49)"
            )
        prices[gpu.strip()] = usd
    return prices


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def price_for(prices: dict[str, float], *names: str) -> float | None:
    """The price whose key names this GPU: exact, else contained in a name (case/dashes ignored)."""
    for key, usd in prices.items():
        if any(_squash(key) == _squash(name) for name in names if name):
            return usd
    for key, usd in prices.items():
        if any(_squash(key) in _squash(name) for name in names if name):
            return usd
    return None
