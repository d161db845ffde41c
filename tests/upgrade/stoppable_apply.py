"""``installer.apply`` on the phased path that stops at the start of one phase until told to go on.

    python -m tests.upgrade.stoppable_apply CONNINFO PHASE

Prints ``PHASE <name>`` when the phase starts and waits for a line on stdin before running it (the
test arranges what makes the phase wait meanwhile); ``DONE`` when every migration is applied. Used
by tests/upgrade/test_kill_phases.py, which kills this process with SIGKILL in the middle of the phase.
"""

from __future__ import annotations

import sys

import psycopg

from pgflow_cli import installer


def main(conninfo: str, phase: str) -> None:
    def progress(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == phase:
            print(f"PHASE {phase}", flush=True)
            sys.stdin.readline()

    with psycopg.connect(conninfo, autocommit=True, application_name="pgflow-cli") as conn:
        installer.apply(conn, online="always", lock_timeout=120, batch_pages=1, progress=progress)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
