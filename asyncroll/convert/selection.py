"""Seeded selection that depends on neither input order nor Python's RNG.

Each candidate is ranked by the SHA-256 of the canonical JSON ``[seed, key]``; the first ``limit`` in
rank order are taken and kept in that order. Because the rank of a candidate depends only on its own key,
reordering the source cannot change what is selected, and ``--limit N`` always yields a prefix of the
unlimited conversion with the same seed (a smaller sample is nested in a larger one).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import TypeVar

from asyncroll.errors import UsageError

T = TypeVar("T")


def rank_key(seed: int, key: str) -> str:
    """The hex SHA-256 of ``[seed, key]`` as compact JSON: the candidate's rank for this seed."""
    blob = json.dumps([seed, key], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def check_limit(limit: int | None) -> None:
    """Refuse a limit that is not a positive integer (``None`` means no limit)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise UsageError(f"--limit must be a positive integer, got {limit!r}")


def select(items: Iterable[T], key: Callable[[T], str], seed: int, limit: int | None) -> list[T]:
    """The first ``limit`` items (all when ``None``) in seeded rank order; ties broken by the key itself."""
    check_limit(limit)
    ranked = sorted(items, key=lambda item: (rank_key(seed, key(item)), key(item)))
    return ranked if limit is None else ranked[:limit]
