"""Progress of a migrator run as typed events: one frozen dataclass per kind of event.

The engine (:mod:`~pgflow_cli.installer.engine`) and the steps it runs (migrations, the conversion
of an earlier build's ledger, the adoption of an upstream schema and its online completion) report
what they do by calling a :data:`ProgressFn` with one of these; ``pgflow migrate apply`` adds the
events of its own checks (preflight, workers, blockers). Consumers match on the class
(``isinstance`` or ``match``); :meth:`Event.to_dict` gives a JSON-ready form. Results (what was
applied, how long it took, what a dry run measured) are not events: they are what the run returns.

Every ``step`` field is the label of the step the event belongs to: ``0003_queue_stage``,
``adoption of pgflow 0.8.0/0.8.1``, ``adoption (online completion)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    """Base of every progress event; ``kind`` names it in :meth:`to_dict`."""

    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        """``{"event": kind, **fields}``: plain JSON values (tuples become lists)."""
        return {"event": self.kind, **{k: _plain(v) for k, v in dataclasses.asdict(self).items()}}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


ProgressFn = Callable[[Event], None]
"""Receives every event of a run, in order, on the migrator's thread (the lock watcher's
:class:`Blocked` comes from its own thread)."""


@dataclass(frozen=True)
class MigratorLockWait(Event):
    """Another migrator holds the migrators' advisory lock; this one waits up to ``wait_seconds``.

    Attributes:
        holders: each holding session in words (pid, application, user, since when; no query text).
        wait_seconds: how long this run waits for it, seconds.
    """

    kind: ClassVar[str] = "migrator_lock_wait"
    holders: tuple[str, ...]
    wait_seconds: float


@dataclass(frozen=True)
class PgmqInstalled(Event):
    """The PGMQ SQL bundled with pgflow-cli was installed (``--install-pgmq``)."""

    kind: ClassVar[str] = "pgmq_installed"
    version: str


@dataclass(frozen=True)
class PreflightPassed(Event):
    """The preflight audit found nothing blocking (``findings`` in all, ``blocking`` = 0)."""

    kind: ClassVar[str] = "preflight_passed"
    findings: int
    blocking: int


@dataclass(frozen=True)
class WorkersAlive(Event):
    """Workers a pending protocol change would strand: live ones (``alive`` with a recent heartbeat,
    of ``functions`` worker functions) and ``enabled_functions`` not fenced; ``protocol`` is the
    worker protocol the database speaks afterwards."""

    kind: ClassVar[str] = "workers_alive"
    alive: int
    functions: int
    enabled_functions: int
    protocol: int


@dataclass(frozen=True)
class Blocked(Event):
    """The migrator waits for a lock that these sessions hold (sent by the lock watcher).

    Attributes:
        blockers: one dict per session (pid, application_name, user_name, state, seconds,
            lock_modes; never its query).
        waiting_on: the object and mode waited for (``object``, ``mode``), or ``None``.
    """

    kind: ClassVar[str] = "blocked"
    blockers: tuple[dict[str, Any], ...]
    waiting_on: dict[str, Any] | None


@dataclass(frozen=True)
class StepStarted(Event):
    """A step starts: each attempt of a one-transaction step, once for a phased one.

    Attributes:
        step: its label.
        attempt: 1 for the first try; more after a lock timeout or deadlock rolled it back.
        online: phase by phase (``True``) or in one transaction.
        resumed_after: the phases a phased run committed before (it resumes after them).
    """

    kind: ClassVar[str] = "step_started"
    step: str
    attempt: int
    online: bool
    resumed_after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Retrying(Event):
    """A transaction hit a lock timeout or a deadlock, was rolled back, and runs again in ``sleep`` s."""

    kind: ClassVar[str] = "retrying"
    step: str
    attempt: int
    error: str
    sleep: float


@dataclass(frozen=True)
class PhaseStarted(Event):
    """A phase of a phased step starts (``mode``: ``tx``, ``batch``, ``notx``, or ``online`` for the
    steps of an adoption's completion)."""

    kind: ClassVar[str] = "phase_started"
    step: str
    phase: str
    mode: str


@dataclass(frozen=True)
class BatchDone(Event):
    """One range of a backfill committed (or, inside a transaction, ran).

    Attributes:
        first_page, pages: the heap pages it covered.
        relation_pages: the table's heap pages when it ran.
        rows: rows it updated.
        ms: how long it took, milliseconds.
    """

    kind: ClassVar[str] = "batch_done"
    step: str
    phase: str
    first_page: int
    pages: int
    relation_pages: int
    rows: int
    ms: int


@dataclass(frozen=True)
class InvalidIndexDropped(Event):
    """An INVALID index left by an interrupted concurrent build is dropped before it is built again."""

    kind: ClassVar[str] = "invalid_index_dropped"
    step: str
    index: str


@dataclass(frozen=True)
class LateLocksGivenBack(Event):
    """The late lock ``lock`` of ``phase`` could not be waited for (a cycle, or the deadlock bound):
    the transaction rolled back, giving every lock back, and runs again shortly."""

    kind: ClassVar[str] = "late_locks_given_back"
    step: str
    phase: str
    lock: str


@dataclass(frozen=True)
class PhaseDone(Event):
    """A phase committed (``duration_ms``: from its start, retries included)."""

    kind: ClassVar[str] = "phase_done"
    step: str
    phase: str
    duration_ms: int


@dataclass(frozen=True)
class StepDone(Event):
    """A step committed, or was rolled back (``dry_run``).

    Attributes:
        duration_ms: from its start, retries included, milliseconds.
        attempts: transactions tried (lock-timeout and deadlock retries included).
    """

    kind: ClassVar[str] = "step_done"
    step: str
    duration_ms: int
    attempts: int
    dry_run: bool
    online: bool


EVENTS: tuple[type[Event], ...] = (MigratorLockWait, PgmqInstalled, PreflightPassed, WorkersAlive, Blocked,
                                   StepStarted, Retrying, PhaseStarted, BatchDone, InvalidIndexDropped,
                                   LateLocksGivenBack, PhaseDone, StepDone)
"""Every kind of event, for renderers that must handle them all (a test checks they do)."""
