"""Shared set-ups of the output tests."""

from __future__ import annotations

import pytest

from pgflow_cli import installer


class _Stop(Exception):
    pass


def leave_in_progress(database) -> None:
    """Apply the pending migrations phase by phase and stop before 0003's last phase: 0003 is left
    in progress (committed phases prepare, backfill, validate, index)."""

    def stop(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == "main":
            raise _Stop()

    with pytest.raises(_Stop):
        installer.apply(database.connect(), online="always", progress=stop)
