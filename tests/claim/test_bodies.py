"""Unusual message bodies: NUL escapes, very large bodies, non-object bodies.

(Non-object bodies without a task are archived as foreign: test_foreign_missing.py; attached to
a task they are fatal: test_fatal.py. A queue no flow owns: test_fatal.py.)
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.claim.helpers import assert_fatal, assert_no_body

SECRET = "body-secret-" + uuid.uuid4().hex
BIG = 5 * 1024 * 1024  # characters of padding: a body of several MB


@pytest.fixture
def plain(cl):
    cl.flow("bodies", [{"slug": "a"}])
    run = cl.start("bodies", {})
    return {"run": run, "worker": cl.worker("bodies")}


@pytest.mark.parametrize("send", ["escape-in-json-text", "nul-in-python-value"])
def test_a_body_with_a_nul_escape_is_rejected_at_send_time(cl, plain, send):
    """PostgreSQL's jsonb cannot hold U+0000: pgmq.send fails and nothing reaches the queue."""
    before = cl.snapshot()
    with pytest.raises(psycopg.Error) as caught:
        if send == "escape-in-json-text":
            cl.conn.execute("SELECT pgmq.send('bodies', %s::jsonb)", ('{"hello": "\\u0000", "note": "x"}',))
        else:
            cl.conn.execute("SELECT pgmq.send('bodies', %s)", (Jsonb({"hello": "a\x00b"}),))
    assert caught.value.sqlstate == "22P05"  # untranslatable_character
    assert cl.snapshot() == before
    # the queue holds exactly the task's message, which is still claimed normally
    result = cl.claim("bodies", cl.read("bodies"), plain["worker"], "bodies")
    assert [r["outcome"] for r in result.rows] == ["claimed"]


def test_an_escaped_backslash_u0000_text_is_an_ordinary_foreign_string(cl, plain):
    """The six characters \\u0000 (escaped backslash) are valid JSON text, not a NUL."""
    msg = cl.send("bodies", '{"hello": "\\\\u0000"}')
    batch = cl.read("bodies")
    result = cl.claim("bodies", batch, plain["worker"], "bodies")
    assert result.outcomes[msg] == ("archived_foreign", "not_pgflow_work")
    assert len(result.claimed) == 1


def test_a_very_large_foreign_body_is_archived_without_being_copied_into_notices(cl, plain):
    body = json.dumps({"padding": "x" * BIG, "note": SECRET})
    msg = cl.send("bodies", body)
    assert cl.val("SELECT octet_length(message::text) FROM pgmq.q_bodies WHERE msg_id = %s", (msg,)) > BIG
    batch = cl.read("bodies")

    result = cl.claim("bodies", batch, plain["worker"], "bodies")

    assert result.outcomes[msg] == ("archived_foreign", "not_pgflow_work")
    assert len(result.claimed) == 1  # the task in the same batch is claimed
    assert cl.archived("bodies") == [msg]
    assert sum(len(n.text()) for n in result.notices) < 2000
    assert_no_body([n.text() for n in result.notices], [SECRET])


def test_a_very_large_pgflow_shaped_body_without_a_task_is_fatal_and_never_echoed(cl, plain):
    ghost = uuid.uuid4()
    msg = cl.send("bodies", json.dumps({"flow_slug": "bodies", "run_id": str(ghost), "step_slug": "a",
                                        "task_index": 0, "padding": "y" * BIG, "note": SECRET}))
    batch = cl.read("bodies")
    before = cl.snapshot()

    result = cl.claim("bodies", batch, plain["worker"], "bodies")

    assert_fatal(cl, result, before=before, queue="bodies", batch=batch, fatal={msg: "task_missing"},
                 worker_id=plain["worker"], function="bodies-worker", secrets=[SECRET, str(ghost), "y" * 64])
    assert sum(len(n.text()) for n in result.notices) < 2000
    assert len(cl.function_row("bodies-worker")["paused_reason"]) < 500
    # preserved for inspection: the message is still there, whole
    assert cl.val("SELECT md5(message::text) FROM pgmq.q_bodies WHERE msg_id = %s", (msg,)) == before.live["bodies"][msg][2]
    cl.conn.execute("SELECT pgmq.archive('bodies', %s::bigint)", (msg,))
    cl.conn.execute("UPDATE pgflow.worker_functions SET enabled = true")


def test_a_very_large_body_on_a_task_identity_is_fatal(cl, plain):
    """A huge body that does not describe the task whose identity it has: preserved, fatal."""
    run = plain["run"]
    msg = cl.send("bodies", json.dumps({"padding": "z" * BIG, "note": SECRET}))
    original = cl.task(run, "a")["message_id"]
    cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = %s WHERE run_id = %s", (msg, run))
    batch = cl.read("bodies")
    assert batch == [original, msg]
    before = cl.snapshot()
    result = cl.claim("bodies", batch, plain["worker"], "bodies")
    # the task's original message now has no task: pgflow-shaped work without a task
    assert_fatal(cl, result, before=before, queue="bodies", batch=batch,
                 fatal={msg: "message_does_not_match_task", original: "task_missing"}, worker_id=plain["worker"],
                 function="bodies-worker", secrets=[SECRET, "z" * 64])
    cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = %s WHERE run_id = %s", (original, run))
