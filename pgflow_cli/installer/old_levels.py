"""Databases built by an earlier pgflow-cli build at the old levels of the queue stage.

Before the queue stage was written as one migration (``0003_queue_stage``), builds up to commit
:data:`OLD_BUILD` shipped it as fourteen migrations, 0003_queue_identity .. 0016_late_reports, and
sandbox, development and test databases hold their ledger rows. This module is frozen knowledge
about them (it never changes again):

* :data:`OLD_MIGRATIONS`: the name and the known checksums of each of those migrations;
* :data:`LEVEL_16_SCHEMA`: the relational schema a database has when all fourteen are applied
  (``schema_facts`` of sql/queries/installer.sql; ``tests/upgrade/test_old_levels.py`` checks it
  against the fixture built with that build and against a fresh install of 0003_queue_stage);
* :data:`LEVEL_16_FUNCTIONS`: the functions such a database has.

A ledger holding every one of those rows with a known checksum, none in progress, is converted in
one transaction (:func:`pgflow_cli.installer.runner.apply`, docs/upgrade.md "Databases built by an
earlier pgflow-cli"); any other set of them is refused (:func:`classify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OLD_BUILD = "c6993b3"
"""The last pgflow-cli commit that ships migrations 0003-0016: the build that finishes an upgrade
stopped between them."""

FIRST, LAST = 3, 16
"""The versions of the old migrations; the first is also the version of the one that replaces them."""

OLD_MIGRATIONS: dict[int, tuple[str, tuple[str, ...]]] = {
    3: ("queue_identity", ("b75715a944ab9407ba68f3b906c1fa5dc6a23943ac3455ba90f311f449c3730c",)),
    4: ("live_safety", ("298d98c254a9138d090c4fbc965031e2580edfb0c95524d050554c4d16f7b77b",)),
    5: ("private_step_queues", ("fe512e21ea6a802cde0d431bd4ffc99c3ab6a5a3e0598d66e9d163f34dd31cfc",)),
    6: ("compatibility", ("240ac08989c337800eb6a50d53992d3e7d399bf941a50cdeb2d81ae041ff6cf8",)),
    7: ("fence", ("931d6c2cf288f834c7b865217931cfb0a624c05e676fe12d79f611fb32474300",)),
    8: ("drop_flow", ("83c30695deb76472b347bf57a55b712e298f467e2ac01f15a2783b98ed63556d",)),
    # the phased text, and the one-transaction text it replaced (same end state)
    9: ("manual_tasks", ("37884ba3278109c6d8554a0ffa1ebf752c3cec231ce9234e1791654f0f96e3b7",
                         "e318a42e45730e104f6c217d6e31ada17ce95d62724afe3f7ea6fff2b7462dde")),
    10: ("throughput", ("b44aa983977c4a1e3f3621534b2be8d44693c943034abb0930d4364f82d523de",)),
    11: ("run_history_outputs", ("7e1938060d3d4d576bdcabe8050812d12da663ce68a86bb807ba121b8b2902e9",)),
    12: ("claim_paths", ("c3360a1e95389c9a1cff83b5212d40f71096bc61c0e1d7493c095fe13b231cf0",)),
    13: ("report_batches", ("085386f592fe30dd5a3b8ace5f3f9939f8d97e31132791384924e352acc1b3b3",)),
    14: ("batch_completions", ("d2bf11544a06899737db19c80363dd2ceeb63ec8e141ac6d536fcf5f89ec1dfb",)),
    15: ("claim_statements", ("6496035b61ebd4491643fd40d4d5b29402e9f9c5f9975bd9bf779ac83cb25c07",)),
    16: ("late_reports", ("36e6016d3e7ced40907c578d668fb01a1f4888d8aefc7578ac5b14d577d1339c",)),
}
"""Version -> (name, every checksum that build's ledger recorded for it)."""


@dataclass(frozen=True)
class OldRow:
    """A ledger row of one of the old migrations.

    Attributes:
        version, name, checksum, state: as the ledger holds them.
        known: the checksum is one :data:`OLD_MIGRATIONS` lists for that version and name.
    """

    version: int
    name: str
    checksum: str
    state: str

    @property
    def known(self) -> bool:
        expected = OLD_MIGRATIONS.get(self.version)
        return expected is not None and expected[0] == self.name and self.checksum in expected[1]

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class OldLedger:
    """The rows of an earlier build's migrations 0003-0016 in one ledger.

    Attributes:
        rows: those rows, by version.
    """

    rows: tuple[OldRow, ...]

    @property
    def convertible(self) -> bool:
        """Every one of 0003-0016 is recorded, applied, with a known checksum."""
        return not self.problems()

    @property
    def newest(self) -> int:
        return max(row.version for row in self.rows)

    def problems(self) -> list[str]:
        """Why this ledger cannot be converted, one sentence each (empty: it can)."""
        out = []
        versions = {row.version for row in self.rows}
        missing = [v for v in range(FIRST, LAST + 1) if v not in versions]
        if missing:
            out.append(f"migrations {', '.join(f'{v:04d}' for v in missing)} of that build are not applied")
        for row in self.rows:
            if not row.known:
                out.append(f"{row.label}: checksum {row.checksum[:12]}... is not one that build shipped")
            elif row.state != "applied":
                out.append(f"{row.label} is in progress (a phased run of that build stopped part way)")
        return out


def classify(rows: Sequence[OldRow]) -> OldLedger | None:
    """The old-level rows of a ledger, or ``None`` when it has none.

    A ledger has old-level rows when one of its rows of versions 3-16 carries a checksum that
    build shipped; then every row of those versions belongs to them (including rows whose checksum
    is unknown, which make the ledger unconvertible). A ledger whose rows 3-16 all have unknown
    checksums is not an old level (it is another build's, judged by the ordinary rules).

    Args:
        rows: the ledger's rows of versions :data:`FIRST` .. :data:`LAST`.
    """
    if not any(row.known for row in rows):
        return None
    return OldLedger(tuple(sorted(rows, key=lambda row: row.version)))


# The frozen facts below were read once from a database at level 16 built with that build
# (tests/fixtures/old_levels.sql); they never change.

LEVEL_16_SCHEMA: dict[str, dict[str, str]] = {'attribute': {'claim_result.flow_input': '9: jsonb',
               'claim_result.flow_slug': '4: text',
               'claim_result.input': '8: jsonb',
               'claim_result.message_id': '2: bigint',
               'claim_result.outcome': '1: text',
               'claim_result.reason': '3: text',
               'claim_result.run_id': '5: uuid',
               'claim_result.step_slug': '6: text',
               'claim_result.task_index': '7: integer',
               'step_task_record.flow_input': '7: jsonb',
               'step_task_record.flow_slug': '1: text',
               'step_task_record.input': '4: jsonb',
               'step_task_record.msg_id': '5: bigint',
               'step_task_record.run_id': '2: uuid',
               'step_task_record.step_slug': '3: text',
               'step_task_record.task_index': '6: integer'},
 'column': {'deps.created_at': 'timestamp with time zone not null default now()',
            'deps.dep_slug': 'text not null',
            'deps.flow_slug': 'text not null',
            'deps.step_slug': 'text not null',
            'fences.closed_application': 'text',
            'fences.closed_at': 'timestamp with time zone',
            'fences.closed_by': 'text',
            'fences.closed_client': 'text',
            'fences.enabled_changes': 'bigint not null -- worker_functions.enabled_changes right after the fence '
                                      'wrote enabled',
            'fences.fence_id': 'bigint not null generated always as identity',
            'fences.fenced_application': 'text',
            'fences.fenced_at': 'timestamp with time zone not null default clock_timestamp()',
            'fences.fenced_by': 'text not null default CURRENT_USER',
            'fences.fenced_client': 'text',
            'fences.function_created_at': 'timestamp with time zone not null -- worker_functions.created_at when '
                                          'fenced: a deleted and recreated row is a conflict',
            'fences.function_name': 'text not null',
            'fences.outcome_detail': 'text',
            'fences.previous_enabled': 'boolean not null',
            'fences.reason': 'text not null',
            'fences.state': "text not null default 'active'::text",
            'fences.workers_deprecated': 'integer not null default 0',
            'fences.written_enabled': 'boolean not null',
            'flows.created_at': 'timestamp with time zone not null default now()',
            'flows.flow_slug': 'text not null',
            'flows.opt_base_delay': 'integer not null default 1',
            'flows.opt_max_attempts': 'integer not null default 3',
            'flows.opt_timeout': 'integer not null default 60',
            'flows.queue_mode': "text not null default 'flow'::text -- flow: every step uses the flow's default "
                                'queue lower(flow_slug); step: one private generated queue per step',
            'runs.completed_at': 'timestamp with time zone',
            'runs.failed_at': 'timestamp with time zone',
            'runs.flow_slug': 'text not null',
            'runs.input': 'jsonb not null',
            'runs.output': 'jsonb',
            'runs.remaining_steps': 'integer not null default 0',
            'runs.run_id': 'uuid not null default gen_random_uuid()',
            'runs.started_at': 'timestamp with time zone not null default now()',
            'runs.status': "text not null default 'started'::text",
            'step_states.completed_at': 'timestamp with time zone',
            'step_states.created_at': 'timestamp with time zone not null default now()',
            'step_states.error_message': 'text',
            'step_states.failed_at': 'timestamp with time zone',
            'step_states.flow_slug': 'text not null',
            'step_states.initial_tasks': 'integer',
            'step_states.output': 'jsonb',
            'step_states.remaining_deps': 'integer not null default 0',
            'step_states.remaining_tasks': 'integer',
            'step_states.run_id': 'uuid not null',
            'step_states.skip_reason': 'text',
            'step_states.skipped_at': 'timestamp with time zone',
            'step_states.started_at': 'timestamp with time zone',
            'step_states.status': "text not null default 'created'::text",
            'step_states.step_slug': 'text not null',
            'step_tasks.attempts_count': 'integer not null default 0',
            'step_tasks.completed_at': 'timestamp with time zone',
            'step_tasks.error_message': 'text',
            'step_tasks.execution_mode': "text not null default 'queue'::text -- immutable snapshot of the step's "
                                         'execution mode when the task was created; manual tasks have no '
                                         'queue_name and no message',
            'step_tasks.failed_at': 'timestamp with time zone',
            'step_tasks.flow_slug': 'text not null',
            'step_tasks.last_requeued_at': 'timestamp with time zone',
            'step_tasks.last_worker_id': 'uuid',
            'step_tasks.message_id': 'bigint',
            'step_tasks.output': 'jsonb',
            'step_tasks.permanently_stalled_at': 'timestamp with time zone',
            'step_tasks.queue_name': "text -- immutable snapshot of the PGMQ queue holding this task's message; "
                                     'with message_id it is the message identity (NULL only for manual tasks)',
            'step_tasks.queued_at': 'timestamp with time zone not null default now()',
            'step_tasks.requeued_count': 'integer not null default 0',
            'step_tasks.run_id': 'uuid not null',
            'step_tasks.started_at': 'timestamp with time zone',
            'step_tasks.status': "text not null default 'queued'::text",
            'step_tasks.step_slug': 'text not null',
            'step_tasks.task_index': 'integer not null default 0',
            'steps.created_at': 'timestamp with time zone not null default now()',
            'steps.deps_count': 'integer not null default 0',
            'steps.execution_mode': "text not null default 'queue'::text -- queue: tasks are PGMQ messages for "
                                    'workers; manual: tasks have no queue and no worker, trusted code completes '
                                    'them (complete_manual_task)',
            'steps.flow_slug': 'text not null',
            'steps.forbidden_input_pattern': 'jsonb',
            'steps.opt_base_delay': 'integer',
            'steps.opt_max_attempts': 'integer',
            'steps.opt_start_delay': 'integer',
            'steps.opt_timeout': 'integer',
            'steps.queue_name': "text not null -- the step's persisted route: the queue its future tasks are sent "
                                'to (ownership evidence; no queue registry)',
            'steps.required_input_pattern': 'jsonb',
            'steps.step_index': 'integer not null default 0',
            'steps.step_slug': 'text not null',
            'steps.step_type': "text not null default 'single'::text",
            'steps.when_exhausted': "text not null default 'fail'::text",
            'steps.when_unmet': "text not null default 'skip'::text",
            'worker_functions.created_at': 'timestamp with time zone not null default now()',
            'worker_functions.debounce': "interval not null default '00:00:06'::interval",
            'worker_functions.enabled': 'boolean not null default true',
            'worker_functions.enabled_changes': 'bigint not null default 0 -- times enabled changed value (kept by '
                                                'a trigger); the rollout fence restores a row only if it is '
                                                'unchanged since the fence',
            'worker_functions.function_name': 'text not null',
            'worker_functions.last_invoked_at': 'timestamp with time zone',
            'worker_functions.paused_at': 'timestamp with time zone',
            'worker_functions.paused_reason': "text -- why a worker's claim disabled this function (fatal "
                                              'unsupported work); cleared when it is enabled again',
            'worker_functions.updated_at': 'timestamp with time zone not null default now()',
            'workers.deprecated_at': 'timestamp with time zone',
            'workers.flow_slug': 'text -- concrete flow the worker serves (NULL for workers that register without '
                                 'one)',
            'workers.function_name': 'text not null',
            'workers.last_heartbeat_at': 'timestamp with time zone not null default now()',
            'workers.queue_name': 'text not null',
            'workers.started_at': 'timestamp with time zone not null default now()',
            'workers.step_slug': 'text -- step of a private step worker; NULL for a whole-flow worker',
            'workers.stopped_at': 'timestamp with time zone',
            'workers.worker_id': 'uuid not null',
            'workers.worker_version': 'text -- version the worker reported at registration (free text, e.g. its '
                                      'release), so coverage tells old and new workers apart'},
 'constraint': {'deps.deps_check': 'CHECK ((dep_slug <> step_slug))',
                'deps.deps_flow_slug_dep_slug_fkey': 'FOREIGN KEY (flow_slug, dep_slug) REFERENCES '
                                                     'pgflow.steps(flow_slug, step_slug)',
                'deps.deps_flow_slug_fkey': 'FOREIGN KEY (flow_slug) REFERENCES pgflow.flows(flow_slug)',
                'deps.deps_flow_slug_step_slug_fkey': 'FOREIGN KEY (flow_slug, step_slug) REFERENCES '
                                                      'pgflow.steps(flow_slug, step_slug)',
                'deps.deps_pkey': 'PRIMARY KEY (flow_slug, dep_slug, step_slug)',
                'fences.fences_closed_when_not_active': "CHECK (((state = 'active'::text) = (closed_at IS NULL)))",
                'fences.fences_pkey': 'PRIMARY KEY (fence_id)',
                'fences.fences_reason_check': 'CHECK (((char_length(btrim(reason)) >= 1) AND '
                                              '(char_length(btrim(reason)) <= 1000)))',
                'fences.fences_state_check': "CHECK ((state = ANY (ARRAY['active'::text, 'restored'::text, "
                                             "'conflict'::text])))",
                'flows.flows_pkey': 'PRIMARY KEY (flow_slug)',
                'flows.opt_base_delay_is_nonnegative': 'CHECK ((opt_base_delay >= 0))',
                'flows.opt_max_attempts_is_nonnegative': 'CHECK ((opt_max_attempts >= 0))',
                'flows.opt_timeout_is_positive': 'CHECK ((opt_timeout > 0))',
                'flows.queue_mode_is_valid': "CHECK ((queue_mode = ANY (ARRAY['flow'::text, 'step'::text])))",
                'flows.slug_is_valid': 'CHECK (pgflow.is_valid_slug(flow_slug))',
                'runs.completed_at_is_after_started_at': 'CHECK (((completed_at IS NULL) OR (completed_at >= '
                                                         'started_at)))',
                'runs.completed_at_or_failed_at': 'CHECK ((NOT ((completed_at IS NOT NULL) AND (failed_at IS NOT '
                                                  'NULL))))',
                'runs.failed_at_is_after_started_at': 'CHECK (((failed_at IS NULL) OR (failed_at >= started_at)))',
                'runs.runs_flow_slug_fkey': 'FOREIGN KEY (flow_slug) REFERENCES pgflow.flows(flow_slug)',
                'runs.runs_pkey': 'PRIMARY KEY (run_id)',
                'runs.runs_remaining_steps_check': 'CHECK ((remaining_steps >= 0))',
                'runs.status_is_valid': "CHECK ((status = ANY (ARRAY['started'::text, 'failed'::text, "
                                        "'completed'::text])))",
                'step_states.completed_at_is_after_started_at': 'CHECK (((completed_at IS NULL) OR (completed_at '
                                                                '>= started_at)))',
                'step_states.completed_at_or_failed_at_or_skipped_at': 'CHECK ((((((completed_at IS NOT '
                                                                       'NULL))::integer + ((failed_at IS NOT '
                                                                       'NULL))::integer) + ((skipped_at IS NOT '
                                                                       'NULL))::integer) <= 1))',
                'step_states.failed_at_is_after_started_at': 'CHECK (((failed_at IS NULL) OR (failed_at >= '
                                                             'started_at)))',
                'step_states.initial_tasks_known_when_started': "CHECK (((status <> 'started'::text) OR "
                                                                '(initial_tasks IS NOT NULL)))',
                'step_states.output_only_for_completed_or_null': 'CHECK (((output IS NULL) OR (status = '
                                                                 "'completed'::text)))",
                'step_states.remaining_tasks_state_consistency': 'CHECK (((remaining_tasks IS NULL) OR (status <> '
                                                                 "ALL (ARRAY['created'::text, 'skipped'::text]))))",
                'step_states.skip_reason_matches_status': "CHECK (((status = 'skipped'::text) = (skip_reason IS "
                                                          'NOT NULL)))',
                'step_states.skipped_at_is_after_created_at': 'CHECK (((skipped_at IS NULL) OR (skipped_at >= '
                                                              'created_at)))',
                'step_states.started_at_is_after_created_at': 'CHECK (((started_at IS NULL) OR (started_at >= '
                                                              'created_at)))',
                'step_states.status_and_remaining_tasks_match': "CHECK (((status <> 'completed'::text) OR "
                                                                '(remaining_tasks = 0)))',
                'step_states.status_is_valid': "CHECK ((status = ANY (ARRAY['created'::text, 'started'::text, "
                                               "'completed'::text, 'failed'::text, 'skipped'::text])))",
                'step_states.step_states_flow_slug_fkey': 'FOREIGN KEY (flow_slug) REFERENCES '
                                                          'pgflow.flows(flow_slug)',
                'step_states.step_states_flow_slug_step_slug_fkey': 'FOREIGN KEY (flow_slug, step_slug) REFERENCES '
                                                                    'pgflow.steps(flow_slug, step_slug)',
                'step_states.step_states_initial_tasks_check': 'CHECK (((initial_tasks IS NULL) OR (initial_tasks '
                                                               '>= 0)))',
                'step_states.step_states_pkey': 'PRIMARY KEY (run_id, step_slug)',
                'step_states.step_states_remaining_deps_check': 'CHECK ((remaining_deps >= 0))',
                'step_states.step_states_run_id_fkey': 'FOREIGN KEY (run_id) REFERENCES pgflow.runs(run_id)',
                'step_tasks.attempts_count_nonnegative': 'CHECK ((attempts_count >= 0))',
                'step_tasks.completed_at_is_after_started_at': 'CHECK (((completed_at IS NULL) OR (completed_at >= '
                                                               'started_at)))',
                'step_tasks.completed_at_or_failed_at': 'CHECK ((NOT ((completed_at IS NOT NULL) AND (failed_at IS '
                                                        'NOT NULL))))',
                'step_tasks.failed_at_is_after_started_at': 'CHECK (((failed_at IS NULL) OR (failed_at >= '
                                                            'started_at)))',
                'step_tasks.output_valid_only_for_completed': 'CHECK (((output IS NULL) OR (status = ANY '
                                                              "(ARRAY['completed'::text, 'failed'::text]))))",
                'step_tasks.queue_identity_matches_execution_mode': 'CHECK (\n'
                                                                    'CASE execution_mode\n'
                                                                    "    WHEN 'queue'::text THEN (queue_name IS "
                                                                    'NOT NULL)\n'
                                                                    '    ELSE ((queue_name IS NULL) AND '
                                                                    '(message_id IS NULL) AND (last_worker_id IS '
                                                                    "NULL) AND (status <> 'queued'::text) AND "
                                                                    '(requeued_count = 0) AND (last_requeued_at IS '
                                                                    'NULL) AND (permanently_stalled_at IS NULL))\n'
                                                                    'END)',
                'step_tasks.requeued_count_nonnegative': 'CHECK ((requeued_count >= 0))',
                'step_tasks.started_at_is_after_queued_at': 'CHECK (((started_at IS NULL) OR (started_at >= '
                                                            'queued_at)))',
                'step_tasks.step_tasks_execution_mode_is_valid': 'CHECK ((execution_mode = ANY '
                                                                 "(ARRAY['queue'::text, 'manual'::text])))",
                'step_tasks.step_tasks_flow_slug_fkey': 'FOREIGN KEY (flow_slug) REFERENCES '
                                                        'pgflow.flows(flow_slug)',
                'step_tasks.step_tasks_last_worker_id_fkey': 'FOREIGN KEY (last_worker_id) REFERENCES '
                                                             'pgflow.workers(worker_id) ON DELETE SET NULL',
                'step_tasks.step_tasks_pkey': 'PRIMARY KEY (run_id, step_slug, task_index)',
                'step_tasks.step_tasks_run_id_fkey': 'FOREIGN KEY (run_id) REFERENCES pgflow.runs(run_id)',
                'step_tasks.step_tasks_run_id_step_slug_fkey': 'FOREIGN KEY (run_id, step_slug) REFERENCES '
                                                               'pgflow.step_states(run_id, step_slug)',
                'step_tasks.valid_status': "CHECK ((status = ANY (ARRAY['queued'::text, 'started'::text, "
                                           "'completed'::text, 'failed'::text, 'skipped'::text, "
                                           "'cancelled'::text])))",
                'steps.execution_mode_is_valid': "CHECK ((execution_mode = ANY (ARRAY['queue'::text, "
                                                 "'manual'::text])))",
                'steps.forbidden_input_pattern_is_object': 'CHECK (((forbidden_input_pattern IS NULL) OR '
                                                           '(jsonb_typeof(forbidden_input_pattern) = '
                                                           "'object'::text)))",
                'steps.opt_base_delay_is_nonnegative': 'CHECK (((opt_base_delay IS NULL) OR (opt_base_delay >= '
                                                       '0)))',
                'steps.opt_max_attempts_is_nonnegative': 'CHECK (((opt_max_attempts IS NULL) OR (opt_max_attempts '
                                                         '>= 0)))',
                'steps.opt_start_delay_is_nonnegative': 'CHECK (((opt_start_delay IS NULL) OR (opt_start_delay >= '
                                                        '0)))',
                'steps.opt_timeout_is_positive': 'CHECK (((opt_timeout IS NULL) OR (opt_timeout > 0)))',
                'steps.queue_name_is_valid': 'CHECK (pgflow.is_valid_queue_name(queue_name))',
                'steps.required_input_pattern_is_object': 'CHECK (((required_input_pattern IS NULL) OR '
                                                          '(jsonb_typeof(required_input_pattern) = '
                                                          "'object'::text)))",
                'steps.steps_deps_count_check': 'CHECK ((deps_count >= 0))',
                'steps.steps_flow_slug_fkey': 'FOREIGN KEY (flow_slug) REFERENCES pgflow.flows(flow_slug)',
                'steps.steps_flow_slug_step_index_key': 'UNIQUE (flow_slug, step_index)',
                'steps.steps_pkey': 'PRIMARY KEY (flow_slug, step_slug)',
                'steps.steps_step_slug_check': 'CHECK (pgflow.is_valid_slug(step_slug))',
                'steps.steps_step_type_check': "CHECK ((step_type = ANY (ARRAY['single'::text, 'map'::text])))",
                'steps.when_exhausted_is_valid': "CHECK ((when_exhausted = ANY (ARRAY['fail'::text, 'skip'::text, "
                                                 "'skip-cascade'::text])))",
                'steps.when_unmet_is_valid': "CHECK ((when_unmet = ANY (ARRAY['fail'::text, 'skip'::text, "
                                             "'skip-cascade'::text])))",
                'worker_functions.worker_functions_debounce_check': "CHECK ((debounce >= '00:00:01'::interval))",
                'worker_functions.worker_functions_pkey': 'PRIMARY KEY (function_name)',
                'workers.workers_pkey': 'PRIMARY KEY (worker_id)'},
 'index': {'deps_pkey': 'CREATE UNIQUE INDEX deps_pkey ON pgflow.deps USING btree (flow_slug, dep_slug, step_slug)',
           'fences_pkey': 'CREATE UNIQUE INDEX fences_pkey ON pgflow.fences USING btree (fence_id)',
           'flows_pkey': 'CREATE UNIQUE INDEX flows_pkey ON pgflow.flows USING btree (flow_slug)',
           'idx_deps_by_flow_dep': 'CREATE INDEX idx_deps_by_flow_dep ON pgflow.deps USING btree (flow_slug, '
                                   'dep_slug)',
           'idx_deps_by_flow_step': 'CREATE INDEX idx_deps_by_flow_step ON pgflow.deps USING btree (flow_slug, '
                                    'step_slug)',
           'idx_fences_one_active_per_function': 'CREATE UNIQUE INDEX idx_fences_one_active_per_function ON '
                                                 'pgflow.fences USING btree (function_name) WHERE (state = '
                                                 "'active'::text)",
           'idx_flows_normalized_slug': 'CREATE UNIQUE INDEX idx_flows_normalized_slug ON pgflow.flows USING btree '
                                        '(lower((flow_slug COLLATE "C")))',
           'idx_runs_flow_slug': 'CREATE INDEX idx_runs_flow_slug ON pgflow.runs USING btree (flow_slug)',
           'idx_runs_status': 'CREATE INDEX idx_runs_status ON pgflow.runs USING btree (status)',
           'idx_step_states_failed': 'CREATE INDEX idx_step_states_failed ON pgflow.step_states USING btree '
                                     "(run_id, step_slug) WHERE (status = 'failed'::text)",
           'idx_step_states_flow_slug': 'CREATE INDEX idx_step_states_flow_slug ON pgflow.step_states USING btree '
                                        '(flow_slug)',
           'idx_step_states_ready': 'CREATE INDEX idx_step_states_ready ON pgflow.step_states USING btree (run_id, '
                                    "status, remaining_deps) WHERE ((status = 'created'::text) AND (remaining_deps "
                                    '= 0))',
           'idx_step_states_run_id': 'CREATE INDEX idx_step_states_run_id ON pgflow.step_states USING btree '
                                     '(run_id)',
           'idx_step_states_skipped': 'CREATE INDEX idx_step_states_skipped ON pgflow.step_states USING btree '
                                      "(run_id, step_slug) WHERE (status = 'skipped'::text)",
           'idx_step_tasks_completed': 'CREATE INDEX idx_step_tasks_completed ON pgflow.step_tasks USING btree '
                                       "(run_id, step_slug) WHERE (status = 'completed'::text)",
           'idx_step_tasks_failed': 'CREATE INDEX idx_step_tasks_failed ON pgflow.step_tasks USING btree (run_id, '
                                    "step_slug) WHERE (status = 'failed'::text)",
           'idx_step_tasks_flow_run_step': 'CREATE INDEX idx_step_tasks_flow_run_step ON pgflow.step_tasks USING '
                                           'btree (flow_slug, run_id, step_slug)',
           'idx_step_tasks_last_worker': 'CREATE INDEX idx_step_tasks_last_worker ON pgflow.step_tasks USING btree '
                                         "(last_worker_id) WHERE (status = 'started'::text)",
           'idx_step_tasks_manual_waiting': 'CREATE INDEX idx_step_tasks_manual_waiting ON pgflow.step_tasks USING '
                                            "btree (started_at) WHERE ((execution_mode = 'manual'::text) AND "
                                            "(status = 'started'::text))",
           'idx_step_tasks_queue_message': 'CREATE UNIQUE INDEX idx_step_tasks_queue_message ON pgflow.step_tasks '
                                           'USING btree (queue_name, message_id) WHERE (message_id IS NOT NULL)',
           'idx_step_tasks_queued': 'CREATE INDEX idx_step_tasks_queued ON pgflow.step_tasks USING btree (run_id, '
                                    "step_slug) WHERE (status = 'queued'::text)",
           'idx_step_tasks_started': 'CREATE INDEX idx_step_tasks_started ON pgflow.step_tasks USING btree '
                                     "(started_at) WHERE (status = 'started'::text)",
           'idx_steps_normalized_slug': 'CREATE UNIQUE INDEX idx_steps_normalized_slug ON pgflow.steps USING btree '
                                        '(flow_slug, lower((step_slug COLLATE "C")))',
           'idx_steps_queue_name': 'CREATE INDEX idx_steps_queue_name ON pgflow.steps USING btree (queue_name)',
           'idx_workers_function_name': 'CREATE INDEX idx_workers_function_name ON pgflow.workers USING btree '
                                        '(function_name)',
           'idx_workers_heartbeat': 'CREATE INDEX idx_workers_heartbeat ON pgflow.workers USING btree '
                                    '(last_heartbeat_at)',
           'idx_workers_queue_name': 'CREATE INDEX idx_workers_queue_name ON pgflow.workers USING btree '
                                     '(queue_name)',
           'runs_pkey': 'CREATE UNIQUE INDEX runs_pkey ON pgflow.runs USING btree (run_id)',
           'step_states_pkey': 'CREATE UNIQUE INDEX step_states_pkey ON pgflow.step_states USING btree (run_id, '
                               'step_slug)',
           'step_tasks_pkey': 'CREATE UNIQUE INDEX step_tasks_pkey ON pgflow.step_tasks USING btree (run_id, '
                              'step_slug, task_index)',
           'steps_flow_slug_step_index_key': 'CREATE UNIQUE INDEX steps_flow_slug_step_index_key ON pgflow.steps '
                                             'USING btree (flow_slug, step_index)',
           'steps_pkey': 'CREATE UNIQUE INDEX steps_pkey ON pgflow.steps USING btree (flow_slug, step_slug)',
           'worker_functions_pkey': 'CREATE UNIQUE INDEX worker_functions_pkey ON pgflow.worker_functions USING '
                                    'btree (function_name)',
           'workers_pkey': 'CREATE UNIQUE INDEX workers_pkey ON pgflow.workers USING btree (worker_id)'},
 'table': {'deps': '',
           'fences': 'rollout fences (pgflow fence disable/restore): per worker function, the enabled value found '
                     'and written, reason, who, when, outcome',
           'flows': '',
           'runs': '',
           'step_states': '',
           'step_tasks': '',
           'steps': '',
           'worker_functions': 'registry of worker functions; enabled = false is the rollout fence: the HTTP '
                               'starter skips the function and its workers refuse to register',
           'workers': ''},
 'trigger': {'step_tasks.step_tasks_execution_mode_immutable': 'CREATE TRIGGER step_tasks_execution_mode_immutable '
                                                               'BEFORE UPDATE OF execution_mode ON '
                                                               'pgflow.step_tasks FOR EACH ROW WHEN '
                                                               '((old.execution_mode IS DISTINCT FROM '
                                                               'new.execution_mode)) EXECUTE FUNCTION '
                                                               'pgflow._forbid_execution_mode_change()',
             'step_tasks.step_tasks_queue_name_immutable': 'CREATE TRIGGER step_tasks_queue_name_immutable BEFORE '
                                                           'UPDATE OF queue_name ON pgflow.step_tasks FOR EACH ROW '
                                                           'WHEN ((old.queue_name IS DISTINCT FROM '
                                                           'new.queue_name)) EXECUTE FUNCTION '
                                                           'pgflow._forbid_queue_name_change()',
             'worker_functions.worker_functions_clear_pause': 'CREATE TRIGGER worker_functions_clear_pause BEFORE '
                                                              'UPDATE OF enabled ON pgflow.worker_functions FOR '
                                                              'EACH ROW WHEN ((new.enabled AND (NOT old.enabled))) '
                                                              'EXECUTE FUNCTION pgflow._clear_pause_on_enable()',
             'worker_functions.worker_functions_count_enabled_changes': 'CREATE TRIGGER '
                                                                        'worker_functions_count_enabled_changes '
                                                                        'BEFORE UPDATE OF enabled ON '
                                                                        'pgflow.worker_functions FOR EACH ROW WHEN '
                                                                        '((new.enabled IS DISTINCT FROM '
                                                                        'old.enabled)) EXECUTE FUNCTION '
                                                                        'pgflow._count_enabled_change()'}}

"""The relational schema at level 16 (``schema_facts`` rows by kind), compared before a conversion."""

LEVEL_16_FUNCTIONS: tuple[str, ...] = ('pgflow._advance_run(uuid)',
 'pgflow._archive_task_messages(uuid[],text[],integer[])',
 'pgflow._assert_queue_unclaimed(text,text)',
 'pgflow._broadcast(jsonb,text,text)',
 'pgflow._broadcast_run(pgflow.runs,text)',
 'pgflow._broadcast_step(pgflow.step_states)',
 'pgflow._cascade_force_skip_steps(uuid,text,text)',
 'pgflow._clear_pause_on_enable()',
 'pgflow._compare_flow_shapes(jsonb,jsonb)',
 'pgflow._complete_task_progress(uuid,text,integer,jsonb)',
 'pgflow._complete_worker_progress(uuid,text,integer,jsonb)',
 'pgflow._complete_worker_task(uuid,text,integer,jsonb)',
 'pgflow._complete_worker_tasks(uuid[],text[],integer[],jsonb[])',
 'pgflow._count_enabled_change()',
 'pgflow._create_flow_from_shape(text,jsonb,jsonb)',
 'pgflow._create_private_queue(text,text)',
 'pgflow._delete_flow_rows(text,text[])',
 'pgflow._drop_flow_activity(text)',
 'pgflow._drop_flow_route(text)',
 'pgflow._fail_run(uuid,text,text)',
 'pgflow._fail_task_exhausted(uuid,text,integer,text)',
 'pgflow._fence_holds(pgflow.fences,pgflow.worker_functions)',
 'pgflow._fence_lock(text[],text)',
 'pgflow._fence_origin()',
 'pgflow._forbid_execution_mode_change()',
 'pgflow._forbid_queue_name_change()',
 'pgflow._get_flow_shape(text)',
 'pgflow._listed_queue_name(text)',
 'pgflow._lock_flow_for_deletion(text)',
 'pgflow._lock_manual_task(text,uuid,text,integer,text,jsonb,text)',
 'pgflow._normalize_shape_pattern(jsonb)',
 'pgflow._queue_exists(text)',
 'pgflow._refuse_worker_report_of_manual_task(text,pgflow.step_tasks)',
 'pgflow._release_children_of_skipped(uuid,text,text)',
 'pgflow._require_flow(text)',
 'pgflow._require_pg_cron()',
 'pgflow._reserve_private_queues(text,jsonb)',
 'pgflow._set_step_manual(text,text)',
 'pgflow._set_task_messages_vt(uuid[],text[],integer[],integer[])',
 'pgflow._shape_problems(text,jsonb)',
 'pgflow._skip_step(uuid,text,text,text)',
 'pgflow._start_manual_tasks(uuid,text)',
 'pgflow._start_ready_steps_of_runs(uuid[])',
 'pgflow._start_runs(text,text,jsonb,uuid)',
 'pgflow._step_queue_routes(text,jsonb)',
 'pgflow.add_step(text,text,text[],integer,integer,integer,integer,text,jsonb,jsonb,text,text)',
 'pgflow.calculate_retry_delay(numeric,integer)',
 'pgflow.cascade_complete_taskless_steps(uuid)',
 'pgflow.cascade_resolve_conditions(uuid)',
 'pgflow.claim_tasks(text,bigint[],uuid,text,text)',
 'pgflow.cleanup_ensure_workers_logs(integer)',
 'pgflow.complete_manual_task(uuid,text,integer,jsonb)',
 'pgflow.complete_task(uuid,text,integer,jsonb)',
 'pgflow.complete_tasks(jsonb)',
 'pgflow.create_flow(text,integer,integer,integer)',
 'pgflow.default_queue_name(text)',
 'pgflow.delete_flow_and_data(text)',
 'pgflow.drop_flow(text,boolean)',
 'pgflow.drop_flow_plan(text)',
 'pgflow.ensure_flow_compiled(text,jsonb)',
 'pgflow.ensure_flow_compiled(text,jsonb,integer,text,jsonb)',
 'pgflow.ensure_workers()',
 'pgflow.fail_manual_task(uuid,text,integer,text)',
 'pgflow.fail_task(uuid,text,integer,text)',
 'pgflow.fail_tasks(jsonb)',
 'pgflow.fence_disable(text[],text)',
 'pgflow.fence_restore(text[])',
 'pgflow.get_run_with_states(uuid)',
 'pgflow.is_local()',
 'pgflow.is_valid_queue_name(text)',
 'pgflow.is_valid_slug(text)',
 'pgflow.mark_worker_stopped(uuid)',
 'pgflow.maybe_complete_run(uuid)',
 'pgflow.poll_for_tasks(text,integer,integer,integer,integer)',
 'pgflow.protocol_version()',
 'pgflow.register_worker(uuid,text,text,text,text,text)',
 'pgflow.requeue_stalled_tasks()',
 'pgflow.send_heartbeat(uuid)',
 'pgflow.send_heartbeat(uuid,text,text,text,text)',
 'pgflow.set_vt_batch(text,bigint[],integer[])',
 'pgflow.setup_ensure_workers_cron(text)',
 'pgflow.setup_requeue_stalled_tasks_cron(text)',
 'pgflow.slug_violations(text)',
 'pgflow.start_flow(text,jsonb,uuid)',
 'pgflow.start_flow_with_states(text,jsonb,uuid)',
 'pgflow.start_flows(text,jsonb)',
 'pgflow.start_ready_steps(uuid)',
 'pgflow.start_tasks(text,bigint[],uuid)',
 'pgflow.step_queue_name(text,text,integer)',
 'pgflow.track_worker_function(text)')
"""Every function (``regprocedure`` text) of a database at level 16 of that build (pruning not installed)."""
