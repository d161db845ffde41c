"""Scraping a metrics endpoint over real HTTP (urllib) and reading the Prometheus text with
prometheus_client's own parser: what a Prometheus server would see."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.worker.helpers import wait_until


def url(address: tuple[str, int], path: str) -> str:
    host, port = address
    return f"http://{host}:{port}{path}"


def get(address: tuple[str, int], path: str) -> tuple[int, str]:
    """``(status, body)`` of one GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url(address, path), timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Scrape:
    """One scrape's samples: ``value(name, **labels)`` sums the samples of ``name`` whose labels
    include ``labels``; ``text`` is the raw exposition."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def value(self, name: str, **labels: str) -> float:
        return sum(s.value for s in self.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def has(self, name: str, **labels: str) -> bool:
        return any(s.name == name and all(s.labels.get(k) == v for k, v in labels.items()) for s in self.samples)

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


def scrape(address: tuple[str, int]) -> Scrape:
    status, body = get(address, "/metrics")
    assert status == 200, f"/metrics answered {status}: {body[:500]}"
    return Scrape(body)


def scrape_until(address: tuple[str, int], predicate: Callable[[Scrape], Any], what: str) -> Scrape:
    """Scrape until ``predicate(scrape)`` is truthy (a hang guard fails the test); returns that scrape."""
    found: list[Scrape] = []

    def check() -> bool:
        current = scrape(address)
        found[:] = [current]
        return bool(predicate(current))

    wait_until(check, what, describe=lambda: found[0].text[-3000:] if found else "(no scrape)")
    return found[0]
