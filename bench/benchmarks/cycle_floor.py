"""The floor under a task's whole cycle: the rows pgflow must write for a task, and nothing else.

``server_time`` compares the backend CPU of start + read + claim + complete per task of a 3-step
linear flow with one bare PGMQ send + read + archive cycle per message (issue 28's goal: <= 1.25x).
This benchmark adds a third side, in the same server and the same interleaving: the same runs
driven by plain SQL that writes exactly the rows a pgflow run must have at each point, in the
fewest statements, each row reached by its key (a unique-index probe, as the engine does), with
none of the engine's checks, locks, lookups or results:

* start, one statement for all N runs: the run rows, three step states each (the first started,
  the others waiting on one dependency), the first task and its message;
* per batch of 10 (as the Worker reads): the latest protocol's ``read``; the claim's own UPDATE
  (``bench.benchmarks.claim.FLOOR_UPDATE``); then one statement completing the batch: the tasks
  completed with their output, their step states completed, the next step states started with
  their task and message, the runs counted down (completed with an output after the third step),
  the messages moved to the archive.

A pgflow cycle that keeps its guarantees writes at least these rows, so its cost cannot fall
below this side's; the bare cycle writes only the messages. Lower is better. Every figure is the
backend's CPU time (``/proc/<pid>/schedstat``) per task; the wall-clock exec time that
``server_time`` also reports is left to it.
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from bench.benchmarks import server_time
from bench.benchmarks.claim import FLOOR_UPDATE
from bench.core import Context, Result, statements_server
from pgflow_cli.worker.protocol import LATEST
from pgflow_cli.worker.runner import read_visibility

FLOW = "benchCycleFloor"
STEPS = server_time.STEP_SLUGS  # the START and COMPLETE statements below name them

START = """
WITH r AS (
  INSERT INTO pgflow.runs (flow_slug, input, remaining_steps)
  SELECT {flow}, jsonb_build_object('i', i), 3 FROM generate_series(1, {n}) AS i
  RETURNING run_id
), s AS (
  INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_deps, initial_tasks,
                                  remaining_tasks, started_at)
  SELECT {flow}, r.run_id, st.slug, CASE WHEN st.first THEN 'started' ELSE 'created' END,
         CASE WHEN st.first THEN 0 ELSE 1 END, CASE WHEN st.first THEN 1 END, CASE WHEN st.first THEN 1 END,
         CASE WHEN st.first THEN clock_timestamp() END
  FROM r CROSS JOIN (VALUES ('first', true), ('second', false), ('third', false)) AS st (slug, first)
  RETURNING run_id
), m AS (
  INSERT INTO pgmq.{q} (vt, message)
  SELECT clock_timestamp(), jsonb_build_object('flow_slug', {flow}, 'run_id', r.run_id, 'step_slug', 'first',
                                               'task_index', 0)
  FROM r
  RETURNING msg_id, message
)
INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
SELECT {flow}, (m.message ->> 'run_id')::uuid, 'first', 0, {queue}, m.msg_id FROM m
"""

COMPLETE = """
WITH t AS (
  UPDATE pgflow.step_tasks AS t
     SET status = 'completed', completed_at = clock_timestamp(), output = 'null'::jsonb
    FROM (SELECT x.ctid AS tid FROM unnest(%(ids)s::bigint[]) AS m CROSS JOIN LATERAL (
            SELECT y.ctid FROM pgflow.step_tasks AS y WHERE y.queue_name = {queue} AND y.message_id = m LIMIT 1) AS x) AS k
   WHERE t.ctid = k.tid
  RETURNING t.run_id, t.step_slug
), s AS (
  UPDATE pgflow.step_states AS ss
     SET status = 'completed', remaining_tasks = 0, completed_at = clock_timestamp(), output = 'null'::jsonb
    FROM (SELECT x.ctid AS tid FROM t CROSS JOIN LATERAL (
            SELECT y.ctid FROM pgflow.step_states AS y WHERE y.run_id = t.run_id AND y.step_slug = t.step_slug LIMIT 1) AS x) AS k
   WHERE ss.ctid = k.tid
  RETURNING ss.run_id, ss.step_slug
), nx AS (
  UPDATE pgflow.step_states AS ns
     SET status = 'started', remaining_deps = 0, initial_tasks = 1, remaining_tasks = 1, started_at = clock_timestamp()
    FROM (SELECT x.ctid AS tid FROM s CROSS JOIN LATERAL (
            SELECT y.ctid FROM pgflow.step_states AS y
             WHERE y.run_id = s.run_id
               AND y.step_slug = CASE s.step_slug WHEN 'first' THEN 'second' WHEN 'second' THEN 'third' END
             LIMIT 1) AS x) AS k
   WHERE ns.ctid = k.tid
  RETURNING ns.run_id, ns.step_slug
), m AS (
  INSERT INTO pgmq.{q} (vt, message)
  SELECT clock_timestamp(), jsonb_build_object('flow_slug', {flow}, 'run_id', nx.run_id, 'step_slug', nx.step_slug,
                                               'task_index', 0)
  FROM nx
  RETURNING msg_id, message
), nt AS (
  INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
  SELECT {flow}, (m.message ->> 'run_id')::uuid, m.message ->> 'step_slug', 0, {queue}, m.msg_id FROM m
), ru AS (
  UPDATE pgflow.runs AS r
     SET remaining_steps = r.remaining_steps - 1,
         status = CASE WHEN r.remaining_steps = 1 THEN 'completed' ELSE 'started' END,
         completed_at = CASE WHEN r.remaining_steps = 1 THEN clock_timestamp() END,
         -- the run's output: its leaf step's output by slug
         output = CASE WHEN r.remaining_steps = 1 THEN jsonb_build_object('third', 'null'::jsonb) END
    FROM (SELECT x.ctid AS tid FROM s CROSS JOIN LATERAL (
            SELECT y.ctid FROM pgflow.runs AS y WHERE y.run_id = s.run_id LIMIT 1) AS x) AS k
   WHERE r.ctid = k.tid
), gone AS (
  DELETE FROM pgmq.{q} AS g
   USING (SELECT x.ctid AS tid FROM unnest(%(ids)s::bigint[]) AS m CROSS JOIN LATERAL (
            SELECT y.ctid FROM pgmq.{q} AS y WHERE y.msg_id = m LIMIT 1) AS x) AS k
   WHERE g.ctid = k.tid
  RETURNING g.msg_id, g.vt, g.read_ct, g.enqueued_at, g.message
), archived AS (
  INSERT INTO pgmq.{a} (msg_id, vt, read_ct, enqueued_at, message)
  SELECT msg_id, vt, read_ct, enqueued_at, message FROM gone
)
SELECT count(*) FROM t
"""


class FloorDriver:
    """Drives 3-step runs of ``flow_slug`` through the plain-SQL cycle on ``conn`` (autocommit).

    Compiles the flow and registers a worker through the latest protocol (as ``server_time``
    does), then :meth:`cycle` starts and finishes runs with :data:`START` and, per read batch,
    :data:`FLOOR_UPDATE` and :data:`COMPLETE`.
    """

    def __init__(self, conn: psycopg.Connection, flow_slug: str = FLOW) -> None:
        self.conn = conn
        self.protocol = LATEST()
        flow = server_time.linear_flow(flow_slug)
        self.queue = self.protocol.queue_name(flow_slug, None)
        self.worker_id = str(uuid.uuid4())
        self.protocol.check_version(conn)
        self.protocol.compile(conn, flow_slug, flow.shape(), None)
        self.protocol.register(conn, worker_id=self.worker_id, function_name="bench-cycle-floor",
                               queue_name=self.queue, flow_slug=flow_slug, step_slug=None)
        q, a = conn.execute("SELECT pgmq.format_table_name(%s, 'q'), pgmq.format_table_name(%s, 'a')",
                            (self.queue, self.queue)).fetchone()
        self.names = {"flow": sql.Literal(flow_slug), "queue": sql.Literal(self.queue), "q": sql.Identifier(q),
                      "a": sql.Identifier(a)}
        self.complete = sql.SQL(COMPLETE).format(**self.names)
        self.read_vt = read_visibility(None, self.protocol.version, self.protocol.step_settings(conn, flow_slug, None))

    def cycle(self, runs: int) -> None:
        """Start ``runs`` runs and drive every task to completion, reading 10 messages at a time.

        Raises:
            RuntimeError: the queue ran dry early, or a batch wrote fewer rows than it read messages.
        """
        self.conn.execute(sql.SQL(START).format(n=sql.Literal(runs), **self.names))
        done = 0
        while done < runs * len(STEPS):
            ids = self.protocol.read(self.conn, queue_name=self.queue, vt=self.read_vt, qty=server_time.BATCH,
                                     max_poll_seconds=1, poll_interval_ms=10)
            if not ids:
                raise RuntimeError(f"queue ran dry after {done} of {runs * len(STEPS)} tasks")
            claimed = self.conn.execute(FLOOR_UPDATE, {"worker_id": self.worker_id, "ids": ids,
                                                       "queue": self.queue}).rowcount
            completed = self.conn.execute(self.complete, {"ids": ids}).fetchone()[0]
            if claimed != len(ids) or completed != len(ids):
                raise RuntimeError(f"{len(ids)} read, {claimed} claimed, {completed} completed")
            done += completed


def floor_sample(ctx: Context, runs: int) -> float:
    """Backend CPU microseconds per task of the plain-SQL cycle (see the module docstring)."""
    with ctx.database("cycle_floor") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        driver = FloorDriver(conn)
        driver.cycle(max(1, runs // 3))
        conn.execute("ANALYZE")
        cpu = server_time._backend_cpu_ms(conn)
        driver.cycle(runs)
        cpu = server_time._backend_cpu_ms(conn) - cpu
        left = conn.execute("SELECT (SELECT count(*) FROM pgflow.runs WHERE status <> 'completed') "
                            "+ (SELECT count(*) FROM pgflow.step_tasks WHERE status <> 'completed')").fetchone()[0]
        if left:
            raise RuntimeError(f"{left} run(s) or task(s) not completed")
    return 1000 * cpu / (runs * len(STEPS))


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(300)
    work = runs * len(STEPS)
    bare: list[float] = []
    pgflow: list[float] = []
    floor: list[float] = []
    with statements_server(ctx, "cycle_floor") as own:
        for i in range(ctx.repeat):
            bare.append(server_time.bare_sample(own, runs)[1])
            pgflow.append(server_time.pgflow_sample(own, runs, batched=True)[1]["backend_cpu_us_per_task"])
            floor.append(floor_sample(own, runs))
            ctx.log(f"cycle_floor {i + 1}/{ctx.repeat}: backend CPU per task: bare {bare[-1]:.0f}, "
                    f"pgflow {pgflow[-1]:.0f}, floor {floor[-1]:.0f} us")
    baseline = "bare PGMQ send + read + archive, per message (backend CPU)"
    floor_name = "the rows of a pgflow cycle in plain SQL, per task (floor, backend CPU)"
    common = {"lower_is_better": True, "read_batch": server_time.BATCH, "clock": "schedstat"}
    return [
        Result(baseline, "us/msg", bare, work=work, details=common),
        Result(floor_name, "us/task", floor, work=work, baseline=baseline, details=common),
        Result(f"{LATEST.__name__} start + read + claim + complete, per task (backend CPU)", "us/task", pgflow,
               work=work, baseline=baseline, details={**common, "goal": "<= 1.25x"}),
        Result(f"{LATEST.__name__} per task against the floor (backend CPU)", "us/task", pgflow, work=work,
               baseline=floor_name, details=common),
    ]
