"""docs/handlers.md's examples run: ``python -m examples.handlers --dsn ...`` as a real process
against a real database, and every handler feature it shows did what the page says."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.stage2.helpers import clean_env
from tests.worker.helpers import REPO


def test_the_handler_tour_runs_and_shows_each_feature(db):
    result = subprocess.run([sys.executable, "-m", "examples.handlers", "--dsn", db.conninfo], capture_output=True,
                            text=True, cwd=str(REPO), env=clean_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    tasks = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in lines if "]: " in line}
    assert tasks["fetch[0]"] == ("completed after 2 attempt(s) -> [0, 1, 2]; "
                                 "last error: ConnectionError: source news timed out")
    assert [tasks[f"pages[{i}]"] for i in range(3)] == [
        f'completed after 1 attempt(s) -> "page {i} of news"' for i in range(3)]  # the run input, from a map task
    assert tasks["summary[0]"].startswith('completed after 1 attempt(s) -> {"deadline": "')
    assert tasks["summary[0]"].endswith('"pages": 3, "source": "news"}')
    assert tasks["notify[0]"] == 'completed after 1 attempt(s) -> {"sent": true, "to": "ops@example.com"}'
    # FailNow ends its task on the first attempt and skips the step (when_exhausted=skip) with the
    # other task. The two run concurrently: the other task's RetryLater report either landed first
    # (its error stays on the row) or arrived after the skip and was refused (no error on the row).
    assert tasks["enrich[0]"] in (
        "skipped after 1 attempt(s); last error: RetryLater: RateLimited: rate limited; retry after 5s",
        "skipped after 1 attempt(s)")
    assert tasks["enrich[1]"] == "failed after 1 attempt(s); last error: FailNow: item 'missing' does not exist"
    assert "fetch: last attempt (3/3)" not in lines  # fetch succeeded on its second attempt
    assert 'run completed: {"notify": {"sent": true, "to": "ops@example.com"}}' in lines  # enrich was skipped
    assert "task failed (attempt 1/3), retried in 2s: flow=handlerTour step=fetch" in result.stderr


def test_the_pages_code_is_the_tours_code():
    """Each snippet docs/handlers.md shows is the code the tour runs, marked in tour.py."""
    doc = (REPO / "docs" / "handlers.md").read_text()
    source = (REPO / "examples" / "handlers" / "tour.py").read_text()
    snippets = dict(re.findall(r"# --8<-- \[start:(\w+)\]\n(.*?)# --8<-- \[end:\1\]", source, re.S))
    assert sorted(snippets) == ["async", "attempts", "deadline", "directives", "stop"]
    assert [name for name, code in snippets.items() if code.rstrip() not in doc] == []
