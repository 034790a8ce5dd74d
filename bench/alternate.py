"""Interleaving two measurements so that a change in the machine's load hits both alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def abba(first: Callable[[int], T], second: Callable[[int], T], rounds: int) -> tuple[list, list]:
    """Run `first` and `second` `rounds` times each, in the order A B B A A B B A ...; each is
    called with its 0-based attempt number. Returns (first's results, second's results)."""
    a: list[T] = []
    b: list[T] = []
    for i in range(rounds):
        order = ((first, a), (second, b)) if i % 2 == 0 else ((second, b), (first, a))
        for fn, results in order:
            results.append(fn(len(results)))
    return a, b
