"""Flows of the client tests: each ends a run in a known way, most without any timing."""

from __future__ import annotations

from typing import Literal

import psycopg

from pgflow_cli.worker import Flow, protocol


def _boom(value, ctx):
    raise ValueError(f"boom on attempt for run {ctx.run_id[:8]}")


greet = (
    Flow[Literal["fullName", "greeting"]]("greetUser")
    .step("fullName", lambda i, c: f"{i['first']} {i['last']}")
    .step("greeting", lambda d, c: f"Hello, {d['fullName']}!", depends_on=["fullName"])
)
"""Completes through a worker: output ``{"greeting": "Hello, <first> <last>!"}``."""

failing = (
    Flow("failing", max_attempts=2, base_delay=0)
    .step("ok", lambda i, c: "fine")
    .step("boom", _boom, depends_on=["ok"])
)
"""Fails through a worker at step ``boom`` after 2 attempts."""

held = Flow("held").step("approve", manual=True).step("after", lambda d, c: d["approve"], depends_on=["approve"])
"""Stays started until trusted code completes ``approve`` (a hold with no timing in it)."""

approval = Flow("approval").step("approve", manual=True)
"""One manual step: a run ends (completed) exactly when the test completes its task; no worker."""

strict = Flow("strict").step("gate", lambda i, c: i, if_={"go": True}, when_unmet="fail")
"""Fails at start on an input without ``{"go": true}``: a failed step with no failed task, no worker."""

skipper = Flow("skipper").step("gate", lambda i, c: i, if_={"go": True})
"""Completes at start on an input without ``{"go": true}`` (its only step skipped), no worker."""

mapper = Flow("mapper").map("double", lambda x, c: x * 2)
"""A root map step: takes a JSON array."""


def compile_flows(conninfo: str, *flows: Flow) -> None:
    """Create the flows in the database as a worker's startup would (no worker started)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for flow in flows:
            protocol.ProtocolV2().compile(conn, flow.slug, flow.shape(), None)


def approve(conninfo: str, run_id: str, output="yes") -> None:
    """Complete the manual step ``approve`` of a ``held`` or ``approval`` run."""
    from pgflow_cli.operations import manual_tasks

    with psycopg.connect(conninfo, autocommit=True) as conn:
        manual_tasks.complete(conn, run_id, "approve", 0, output)
