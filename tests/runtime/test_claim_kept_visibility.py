"""A claim keeps the visibility its read set when that is within 1 s of the claim's target
(effective timeout + 2 s from the claim), instead of writing the queue row again; any other
visibility is set to the target, as before (docs/claim-protocol.md "Visibility of a claimed message").
The claim guard on a kept message: tests/runtime/test_claims.py (visibility-kept).
"""

from __future__ import annotations

import pytest
from psycopg import sql

pytestmark = pytest.mark.upgraded_only(reason="claim_tasks (0003) keeps a read's visibility near its target")

TOLERANCE = 1.5


def _row(rt, queue: str, msg_id: int) -> tuple:
    """The queue row's visibility and its row version (ctid, xmin): a rewrite changes the version."""
    row = rt.one(sql.SQL("SELECT vt, ctid::text AS ctid, xmin::text AS xmin FROM {} WHERE msg_id = %s").format(rt.qtable(queue)),
                 (msg_id,))
    return (row["vt"], row["ctid"], row["xmin"])


# The read's visibility counts from the read, the target from the claim a moment later, so each
# case sits 1 s or more inside or outside the 1 s band: it holds while read and claim are less
# than 2 s apart (two consecutive statements on one connection).
@pytest.mark.parametrize(("step_timeout", "read_vt", "kept"), [
    (7, 10, True),     # timeout + 3 s at the read: within 1 s of the target
    (None, 48, True),  # the flow's timeout (45 s) when the step has none
    (7, 13, False),    # 4 s beyond the target: set to it
    (7, 5, False),     # a short read (the worker's when its steps' timeouts differ): extended
])
def test_claim_keeps_a_visibility_within_one_second_of_its_target(rt, step_timeout, read_vt, kept):
    options = {} if step_timeout is None else {"timeout": step_timeout}
    rt.flow("kept", [{"slug": "a", **options}], timeout=45)
    run = rt.start("kept", {})
    [msg] = rt.read("kept", vt=read_vt)
    before = _row(rt, "kept", msg["msg_id"])

    [task] = rt.claim("kept", [msg["msg_id"]])
    assert (task["run_id"], task["step_slug"]) == (run, "a")
    after = _row(rt, "kept", msg["msg_id"])
    target = 9 if step_timeout == 7 else 47
    if kept:
        assert after[:2] == before[:2]  # the same visibility, the same row version: not rewritten
        assert rt.vt_in("kept", msg["msg_id"]) == pytest.approx(read_vt, abs=TOLERANCE)
    else:
        assert after[1] != before[1]
        assert rt.vt_in("kept", msg["msg_id"]) == pytest.approx(target, abs=TOLERANCE)
    assert rt.task(run, "a")["status"] == "started"
