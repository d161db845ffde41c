"""Tests that tests/test_server_cleanup.py runs in a pytest of its own, to see what happens to the test server
when that run is ended early. Not collected by the suite (the file name does not start with test_).

Each test writes where its run's server lives to the file $PGFLOW_PROBE_FILE (JSON: ``base``, the
server's base directory; ``data_dir``; ``postmaster``, its pid) and then waits for the signal the
outer test sends, or crashes its own process.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path


def _announce(harness) -> None:
    data_dir = harness.server.data_dir
    postmaster = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    probe = Path(os.environ["PGFLOW_PROBE_FILE"])
    partial = probe.with_suffix(".partial")
    partial.write_text(json.dumps({"base": str(harness.base), "data_dir": str(data_dir), "postmaster": postmaster}))
    partial.rename(probe)  # the outer test never reads half a file


def test_hold_the_server_until_a_signal(harness):
    _announce(harness)
    while True:
        signal.pause()  # the run's SIGTERM/SIGHUP handler raises; an xdist worker is ended by its controller


def test_crash_the_worker(harness):
    _announce(harness)
    os.kill(os.getpid(), signal.SIGKILL)
