"""Long waits say they are waiting at least every 5 s, whatever their --interval."""

from __future__ import annotations

from pgflow_cli.operations.waiting import PROGRESS_EVERY, Pacer, pause
from tests.support.cli import run_cli


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_pause_ticks_every_five_seconds_and_not_at_its_end():
    clock, ticks = FakeClock(), []
    pause(17, lambda: ticks.append(clock.now), clock=clock, sleep=clock.sleep)
    assert ticks == [5, 10, 15] and clock.now == 17
    pause(3, lambda: ticks.append(clock.now), clock=clock, sleep=clock.sleep)
    assert ticks == [5, 10, 15] and clock.now == 20  # shorter than a tick: nothing to add
    pause(-1, lambda: ticks.append(clock.now), clock=clock, sleep=clock.sleep)
    assert clock.now == 20


def test_the_pacer_prints_changes_at_once_and_the_same_state_every_five_seconds():
    clock = FakeClock()
    pacer = Pacer(clock=clock)
    assert pacer.due("a") and not pacer.due("a")
    assert pacer.due("b")  # a change
    clock.now += PROGRESS_EVERY - 0.1
    assert not pacer.due("b")
    clock.now += 0.1
    assert pacer.due("b") and not pacer.due("b")


def test_coverage_wait_with_a_long_interval_still_reports_every_five_seconds(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('waitFlow')")
    result = run_cli("coverage", "--dsn", db.conninfo, "--wait", "--timeout", "11", "--interval", "30")
    assert result.code == 5, result.output
    waiting = [line for line in result.stderr.splitlines() if line.startswith("waiting (")]
    assert len(waiting) >= 3, result.stderr  # at the first check, then after 5 s and 10 s of the 30 s interval
