"""Decision-table rows "no task + body not shaped like pgflow work -> archived_foreign" and
"message gone -> missing".

A foreign message (something an application wrote into a pgflow-owned queue) is archived, not
deleted, with one WARNING naming the queue and the message ids, never the body. The worker's
function stays enabled. A message id that is no longer in the queue changes nothing.
"""

from __future__ import annotations

import uuid

import pytest

from tests.claim.helpers import assert_no_body

SECRET = "body-secret-" + uuid.uuid4().hex


@pytest.fixture
def plain(cl):
    cl.flow("plain", [{"slug": "a"}])
    return cl.worker("plain")


@pytest.mark.parametrize("body", [
    '{"hello": "world", "note": "%s"}' % SECRET,
    '[{"flow_slug": "plain", "run_id": "%s", "step_slug": "a", "task_index": 0}, "%s"]' % (uuid.uuid4(), SECRET),
    '"%s"' % SECRET,
    "12345",
    "null",
    "{}",
    '{"Flow_Slug": "plain", "RUN_ID": "%s", "note": "%s"}' % (uuid.uuid4(), SECRET),
    '{"payload": {"flow_slug": "plain", "run_id": "%s", "step_slug": "a", "task_index": 0}, "note": "%s"}'
    % (uuid.uuid4(), SECRET),
], ids=["object", "array", "string", "number", "json-null", "empty-object", "other-case-keys", "nested"])
def test_a_foreign_message_is_archived_with_a_warning_that_names_ids_only(cl, plain, body):
    msg = cl.send("plain", body)
    assert cl.read("plain") == [msg]

    result = cl.claim("plain", [msg], plain, "plain")

    assert result.outcomes == {msg: ("archived_foreign", "not_pgflow_work")}
    row = result.rows[0]
    assert (row["flow_slug"], row["run_id"], row["step_slug"], row["task_index"]) == (None, None, None, None)
    assert cl.message("plain", msg) is None
    assert cl.archived("plain") == [msg]
    [warning] = result.warnings()
    assert '"plain"' in warning.message and str(msg) in warning.message
    assert_no_body([n.text() for n in result.notices], [SECRET])
    assert cl.function_row("plain-worker")["enabled"] is True
    assert cl.worker_row(plain)["deprecated_at"] is None


def test_a_message_with_an_sql_null_body_is_foreign(cl, plain):
    msg = cl.val("SELECT * FROM pgmq.send('plain', NULL::jsonb)")
    result = cl.claim("plain", cl.read("plain"), plain, "plain")
    assert result.outcomes == {msg: ("archived_foreign", "not_pgflow_work")}
    assert cl.archived("plain") == [msg]


def test_several_foreign_messages_get_one_warning_listing_all_ids(cl, plain):
    ids = [cl.send("plain", {"n": n, "note": SECRET}) for n in range(5)]
    result = cl.claim("plain", cl.read("plain"), plain, "plain")
    assert result.outcomes == {m: ("archived_foreign", "not_pgflow_work") for m in ids}
    [warning] = result.warnings()
    assert "5 foreign message(s)" in warning.message
    assert all(str(m) in warning.message for m in ids)
    assert warning.hint and "must not send" in warning.hint
    assert_no_body([n.text() for n in result.notices], [SECRET])
    assert cl.archived("plain") == ids


def test_a_message_id_that_is_not_in_the_queue_is_missing(cl, plain):
    run = cl.start("plain", {})
    before = cl.snapshot()
    result = cl.claim("plain", [4242], plain, "plain")
    assert result.outcomes == {4242: ("missing", "message_gone")}
    assert result.notices == []
    assert cl.snapshot() == before
    assert cl.task(run, "a")["status"] == "queued"


def test_a_message_archived_meanwhile_is_missing(cl, plain):
    msg = cl.send("plain", {"hello": "world"})
    [read] = cl.read("plain")
    # someone else (another worker's claim) archived it between the read and this claim
    cl.conn.execute("SELECT pgmq.archive('plain', %s::bigint)", (msg,))
    before = cl.snapshot()
    result = cl.claim("plain", [read], plain, "plain")
    assert result.outcomes == {msg: ("missing", "message_gone")}
    assert result.notices == []
    assert cl.snapshot() == before
