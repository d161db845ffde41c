"""The visibility a worker reads with, and that its claim then keeps (docs/claim-protocol.md
"Visibility of a claimed message"): every served step with the same effective timeout -> the read
hides the message for that timeout + 2 s, and the claim locks the queue row instead of writing it a
second time; different timeouts -> a 5 s read the claim extends.
"""

from __future__ import annotations

import threading

import pytest

from pgflow_cli.worker import Flow
from tests.worker.helpers import wait_until


def _claimed_message(env, flow_slug: str, step: str) -> dict:
    """The started task's message: its visibility (seconds from now) and whether the claim's
    transaction (the one that started the task) also wrote the queue row."""
    return env.one(
        "SELECT extract(epoch FROM q.vt - clock_timestamp()) AS vt_in, q.xmin::text = t.xmin::text AS claim_wrote_it "
        f"FROM pgflow.step_tasks AS t JOIN pgmq.q_{flow_slug.lower()} AS q ON q.msg_id = t.message_id "
        "WHERE t.flow_slug = %s AND t.step_slug = %s AND t.status = 'started'", (flow_slug, step))


@pytest.mark.parametrize(("timeouts", "kept"), [((7, None), True), ((7, 20), False)],
                         ids=["one-timeout", "two-timeouts"])
def test_the_claim_keeps_the_reads_visibility_when_the_steps_share_one_timeout(env, timeouts, kept):
    release = threading.Event()

    def hold(flow_input, ctx):
        release.wait(60)
        return {}

    slug = "readVt" + ("One" if kept else "Two")
    first, second = timeouts
    # a second, independent root step: same timeout as the first (the flow's), or its own
    flow = Flow(slug, timeout=7).step("a", hold, timeout=first).step("b", hold, timeout=second)
    worker = env.start_worker(flow)
    try:
        env.start_run(slug, {})
        wait_until(lambda: env.val("SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = %s AND status = 'started'",
                                   (slug,)) == 2, "both tasks claimed")
        message = _claimed_message(env, slug, "a")
        assert message["claim_wrote_it"] is (not kept)
        assert float(message["vt_in"]) == pytest.approx(9, abs=1.5)  # timeout + 2 s from the claim, either way
    finally:
        release.set()
        env.stop_workers([worker])
