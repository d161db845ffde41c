"""What each published pgflow release leaves in the catalog: the fingerprints recognition compares.

Derived from the release fact sheet (``upstream-releases.md``: §2 schema matrix, §2.5 function
table, §3 markers). Releases whose catalogs are identical form one :class:`ReleaseGroup`; no
database fact tells its members apart (0.8.0/0.8.1/0.9.x, 0.13.0/0.13.1, 0.14.0/0.14.1).

The shape of a group is the 0.8.x shape plus every later group's changes, so each group below
lists only what it changed. A shape is a mapping ``key -> detail`` per kind:

* ``table``: table name -> ``""``;
* ``column``: ``table.column`` -> ``type [not null] [default expr]`` (as ``format_type`` and
  ``pg_get_expr`` print them);
* ``attribute``: ``step_task_record.attribute`` -> type;
* ``constraint``: ``table.constraint`` -> the ``contype`` letter (``p`` ``f`` ``u`` ``c``);
* ``index``: index name -> table;
* ``function``: ``name(identity arguments)`` -> result type.

Function bodies are compared separately, by the first 8 hex digits of ``md5(prosrc)``
(:data:`BODY_MD5`); only 0.13.3 differs from 0.13.2 by a body alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

KINDS = ("table", "column", "attribute", "constraint", "index", "function")
"""Object kinds a shape holds, in report order."""

TS = "timestamp with time zone"


def _columns(table: str, *specs: str) -> dict[str, str]:
    """``"name | detail"`` specs of one table -> ``{"table.name": detail}``."""
    out = {}
    for spec in specs:
        name, _, detail = spec.partition("|")
        out[f"{table}.{name.strip()}"] = detail.strip()
    return out


def _constraints(table: str, kind: str, *names: str) -> dict[str, str]:
    return {f"{table}.{name}": kind for name in names}


_BASE_COLUMNS = {
    **_columns("flows", f"created_at | {TS} not null default now()", "flow_slug | text not null",
               "opt_base_delay | integer not null default 1", "opt_max_attempts | integer not null default 3",
               "opt_timeout | integer not null default 60"),
    **_columns("steps", f"created_at | {TS} not null default now()", "deps_count | integer not null default 0",
               "flow_slug | text not null", "opt_base_delay | integer", "opt_max_attempts | integer",
               "opt_start_delay | integer", "opt_timeout | integer", "step_index | integer not null default 0",
               "step_slug | text not null", "step_type | text not null default 'single'::text"),
    **_columns("deps", f"created_at | {TS} not null default now()", "dep_slug | text not null",
               "flow_slug | text not null", "step_slug | text not null"),
    **_columns("runs", f"completed_at | {TS}", f"failed_at | {TS}", "flow_slug | text not null",
               "input | jsonb not null", "output | jsonb", "remaining_steps | integer not null default 0",
               "run_id | uuid not null default gen_random_uuid()", f"started_at | {TS} not null default now()",
               "status | text not null default 'started'::text"),
    **_columns("step_states", f"completed_at | {TS}", f"created_at | {TS} not null default now()",
               "error_message | text", f"failed_at | {TS}", "flow_slug | text not null", "initial_tasks | integer",
               "remaining_deps | integer not null default 0", "remaining_tasks | integer", "run_id | uuid not null",
               f"started_at | {TS}", "status | text not null default 'created'::text", "step_slug | text not null"),
    **_columns("step_tasks", "attempts_count | integer not null default 0", f"completed_at | {TS}",
               "error_message | text", f"failed_at | {TS}", "flow_slug | text not null", "last_worker_id | uuid",
               "message_id | bigint", "output | jsonb", f"queued_at | {TS} not null default now()",
               "run_id | uuid not null", f"started_at | {TS}", "status | text not null default 'queued'::text",
               "step_slug | text not null", "task_index | integer not null default 0"),
    **_columns("workers", f"deprecated_at | {TS}", "function_name | text not null",
               f"last_heartbeat_at | {TS} not null default now()", "queue_name | text not null",
               f"started_at | {TS} not null default now()", "worker_id | uuid not null"),
}

_BASE_CONSTRAINTS = {
    **_constraints("flows", "p", "flows_pkey"),
    **_constraints("flows", "c", "opt_base_delay_is_nonnegative", "opt_max_attempts_is_nonnegative",
                   "opt_timeout_is_positive", "slug_is_valid"),
    **_constraints("steps", "p", "steps_pkey"),
    **_constraints("steps", "u", "steps_flow_slug_step_index_key"),
    **_constraints("steps", "f", "steps_flow_slug_fkey"),
    **_constraints("steps", "c", "opt_base_delay_is_nonnegative", "opt_max_attempts_is_nonnegative",
                   "opt_start_delay_is_nonnegative", "opt_timeout_is_positive", "steps_deps_count_check",
                   "steps_step_slug_check", "steps_step_type_check"),
    **_constraints("deps", "p", "deps_pkey"),
    **_constraints("deps", "f", "deps_flow_slug_dep_slug_fkey", "deps_flow_slug_fkey", "deps_flow_slug_step_slug_fkey"),
    **_constraints("deps", "c", "deps_check"),
    **_constraints("runs", "p", "runs_pkey"),
    **_constraints("runs", "f", "runs_flow_slug_fkey"),
    **_constraints("runs", "c", "completed_at_is_after_started_at", "completed_at_or_failed_at",
                   "failed_at_is_after_started_at", "runs_remaining_steps_check", "status_is_valid"),
    **_constraints("step_states", "p", "step_states_pkey"),
    **_constraints("step_states", "f", "step_states_flow_slug_fkey", "step_states_flow_slug_step_slug_fkey",
                   "step_states_run_id_fkey"),
    **_constraints("step_states", "c", "completed_at_is_after_started_at", "completed_at_or_failed_at",
                   "failed_at_is_after_started_at", "initial_tasks_known_when_started",
                   "remaining_tasks_state_consistency", "started_at_is_after_created_at",
                   "status_and_remaining_tasks_match", "status_is_valid", "step_states_initial_tasks_check",
                   "step_states_remaining_deps_check"),
    **_constraints("step_tasks", "p", "step_tasks_pkey"),
    **_constraints("step_tasks", "f", "step_tasks_flow_slug_fkey", "step_tasks_last_worker_id_fkey",
                   "step_tasks_run_id_fkey", "step_tasks_run_id_step_slug_fkey"),
    **_constraints("step_tasks", "c", "attempts_count_nonnegative", "completed_at_is_after_queued_at",
                   "completed_at_is_after_started_at", "completed_at_or_failed_at", "failed_at_is_after_queued_at",
                   "failed_at_is_after_started_at", "output_valid_only_for_completed", "started_at_is_after_queued_at",
                   "valid_status"),
    **_constraints("workers", "p", "workers_pkey"),
}

_BASE_INDEXES = {
    "flows_pkey": "flows", "steps_pkey": "steps", "steps_flow_slug_step_index_key": "steps", "deps_pkey": "deps",
    "runs_pkey": "runs", "step_states_pkey": "step_states", "step_tasks_pkey": "step_tasks",
    "workers_pkey": "workers", "idx_deps_by_flow_dep": "deps", "idx_deps_by_flow_step": "deps",
    "idx_runs_flow_slug": "runs", "idx_runs_status": "runs", "idx_step_states_failed": "step_states",
    "idx_step_states_flow_slug": "step_states", "idx_step_states_ready": "step_states",
    "idx_step_states_run_id": "step_states", "idx_step_tasks_completed": "step_tasks",
    "idx_step_tasks_failed": "step_tasks", "idx_step_tasks_flow_run_step": "step_tasks",
    "idx_step_tasks_last_worker": "step_tasks", "idx_step_tasks_message_id": "step_tasks",
    "idx_step_tasks_queued": "step_tasks", "idx_step_tasks_queued_msg": "step_tasks",
    "idx_step_tasks_started": "step_tasks", "idx_workers_heartbeat": "workers", "idx_workers_queue_name": "workers",
}

_TASK_RECORD = "SETOF pgflow.step_task_record"
_BASE_FUNCTIONS = {
    "add_step(flow_slug text, step_slug text, deps_slugs text[], max_attempts integer, base_delay integer, "
    "timeout integer, start_delay integer, step_type text)": "pgflow.steps",
    "calculate_retry_delay(base_delay numeric, attempts_count integer)": "integer",
    "cascade_complete_taskless_steps(run_id uuid)": "integer",
    "complete_task(run_id uuid, step_slug text, task_index integer, output jsonb)": "SETOF pgflow.step_tasks",
    "create_flow(flow_slug text, max_attempts integer, base_delay integer, timeout integer)": "pgflow.flows",
    "fail_task(run_id uuid, step_slug text, task_index integer, error_message text)": "SETOF pgflow.step_tasks",
    "get_run_with_states(run_id uuid)": "jsonb",
    "is_valid_slug(slug text)": "boolean",
    "maybe_complete_run(run_id uuid)": "void",
    "poll_for_tasks(queue_name text, vt integer, qty integer, max_poll_seconds integer, poll_interval_ms integer)":
        _TASK_RECORD,
    "set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets integer[])":
        f"TABLE(msg_id bigint, read_ct integer, enqueued_at {TS}, vt {TS}, message jsonb, headers jsonb)",
    "start_flow(flow_slug text, input jsonb, run_id uuid)": "SETOF pgflow.runs",
    "start_flow_with_states(flow_slug text, input jsonb, run_id uuid)": "jsonb",
    "start_ready_steps(run_id uuid)": "void",
    "start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)": _TASK_RECORD,
}

_BASE_ATTRIBUTES = {
    "step_task_record.flow_slug": "text", "step_task_record.run_id": "uuid", "step_task_record.step_slug": "text",
    "step_task_record.input": "jsonb", "step_task_record.msg_id": "bigint", "step_task_record.task_index": "integer",
}

_BASE_TABLES = {t: "" for t in ("flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers")}


@dataclass(frozen=True)
class Change:
    """What one release group changed in the catalog, relative to the group before it.

    Attributes:
        added: ``{kind: {key: detail}}`` of objects that appear.
        removed: ``{kind: (key, ...)}`` of objects that disappear.
    """

    added: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    removed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseGroup:
    """Published releases with one identical catalog.

    Attributes:
        releases: the member versions, oldest first (e.g. ``("0.13.0", "0.13.1")``).
        change: what this group changed relative to the previous group.
        notes: what the group brought that matters when adopting it (fact sheet §4).
    """

    releases: tuple[str, ...]
    change: Change
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``"0.13.0/0.13.1"``: every member, as the reports print it."""
        return "/".join(self.releases)

    @property
    def newest(self) -> str:
        return self.releases[-1]


_EW = "ensure_workers()"
GROUPS: tuple[ReleaseGroup, ...] = (
    ReleaseGroup(("0.8.0", "0.8.1", "0.9.0", "0.9.1"), Change(added={
        "table": _BASE_TABLES, "column": _BASE_COLUMNS, "attribute": _BASE_ATTRIBUTES,
        "constraint": _BASE_CONSTRAINTS, "index": _BASE_INDEXES, "function": _BASE_FUNCTIONS}),
        notes=("step outputs are not stored on step_states: adoption backfills completed steps as 0.13.0 did",
               "task inputs still carry the run key: workers older than 0.12 must be stopped before adoption")),
    ReleaseGroup(("0.10.0",), Change(added={
        "table": {"worker_functions": ""},
        "column": {**_columns("worker_functions", f"created_at | {TS} not null default now()",
                              "debounce | interval not null default '00:00:06'::interval",
                              "enabled | boolean not null default true", "function_name | text not null",
                              f"last_invoked_at | {TS}", f"updated_at | {TS} not null default now()"),
                   "workers.stopped_at": TS},
        "constraint": {"worker_functions.worker_functions_pkey": "p", "worker_functions.worker_functions_debounce_check": "c"},
        "index": {"worker_functions_pkey": "worker_functions"},
        "function": {
            "_compare_flow_shapes(p_local jsonb, p_db jsonb)": "text[]",
            "_create_flow_from_shape(p_flow_slug text, p_shape jsonb)": "void",
            "_get_flow_shape(p_flow_slug text)": "jsonb",
            "delete_flow_and_data(p_flow_slug text)": "void",
            "ensure_flow_compiled(flow_slug text, shape jsonb)": "jsonb",
            "is_local()": "boolean",
            _EW: "TABLE(function_name text, invoked boolean, request_id bigint)",
            "track_worker_function(function_name text)": "void",
            "mark_worker_stopped(worker_id uuid)": "void",
            "cleanup_ensure_workers_logs(retention_hours integer)": "TABLE(cron_deleted bigint)",
            "setup_ensure_workers_cron(cron_interval text)": "text"}}),
        notes=("pg_cron jobs pgflow_ensure_workers (every second) and pgflow_cleanup_logs (hourly)",)),
    ReleaseGroup(("0.11.0",), Change(
        added={"function": {"ensure_flow_compiled(flow_slug text, shape jsonb, allow_data_loss boolean)": "jsonb"}},
        removed={"function": ("ensure_flow_compiled(flow_slug text, shape jsonb)",)})),
    ReleaseGroup(("0.12.0",), Change(added={"attribute": {"step_task_record.flow_input": "jsonb"}})),
    ReleaseGroup(("0.13.0", "0.13.1"), Change(added={
        "column": {"step_states.output": "jsonb"},
        "constraint": {"step_states.output_only_for_completed_or_null": "c"}})),
    ReleaseGroup(("0.13.2",), Change(added={
        "column": _columns("step_tasks", f"last_requeued_at | {TS}", f"permanently_stalled_at | {TS}",
                           "requeued_count | integer not null default 0"),
        "function": {"requeue_stalled_tasks()": "integer", "setup_requeue_stalled_tasks_cron(cron_interval text)": "text"}}),
        notes=("pg_cron job pgflow_requeue_stalled_tasks (every 15 seconds)",)),
    ReleaseGroup(("0.13.3",), Change()),
    ReleaseGroup(("0.14.0", "0.14.1"), Change(
        added={
            "column": {**_columns("steps", "forbidden_input_pattern | jsonb", "required_input_pattern | jsonb",
                                  "when_exhausted | text not null default 'fail'::text",
                                  "when_unmet | text not null default 'skip'::text"),
                       **_columns("step_states", "skip_reason | text", f"skipped_at | {TS}")},
            "constraint": {**_constraints("step_states", "c", "completed_at_or_failed_at_or_skipped_at",
                                          "skip_reason_matches_status", "skipped_at_is_after_created_at"),
                           **_constraints("steps", "c", "forbidden_input_pattern_is_object",
                                          "required_input_pattern_is_object", "when_exhausted_is_valid",
                                          "when_unmet_is_valid")},
            "index": {"idx_step_states_skipped": "step_states"},
            "function": {
                "add_step(flow_slug text, step_slug text, deps_slugs text[], max_attempts integer, "
                "base_delay integer, timeout integer, start_delay integer, step_type text, "
                "required_input_pattern jsonb, forbidden_input_pattern jsonb, when_unmet text, "
                "when_exhausted text)": "pgflow.steps",
                "cascade_resolve_conditions(run_id uuid)": "boolean",
                "_cascade_force_skip_steps(run_id uuid, step_slug text, skip_reason text)": "integer",
                "_archive_task_message(p_run_id uuid, p_step_slug text, p_task_index integer)": "void"}},
        removed={
            "constraint": ("step_states.completed_at_or_failed_at",),
            "function": ("add_step(flow_slug text, step_slug text, deps_slugs text[], max_attempts integer, "
                         "base_delay integer, timeout integer, start_delay integer, step_type text)",)})),
)
"""Every release group from 0.8.0 to 0.14.1, oldest first."""

BODY_MD5: Mapping[str, Mapping[str, str]] = MappingProxyType({
    # function name -> {first release group member where the body took this value: md5 prefix}
    "start_tasks": {"0.8.0": "b37f5e84", "0.12.0": "f7688878", "0.13.0": "eb4fb78d", "0.14.0": "e618145b"},
    "start_ready_steps": {"0.8.0": "8d2a30bb", "0.13.0": "6145906c", "0.14.0": "3900b4f1"},
    "complete_task": {"0.8.0": "65d39dea", "0.13.0": "fac183a5", "0.14.0": "ec6d0f6c"},
    "maybe_complete_run": {"0.8.0": "f57acf03", "0.13.0": "e7dafa62"},
    "cascade_complete_taskless_steps": {"0.8.0": "85584a7f", "0.13.0": "b582f444"},
    "fail_task": {"0.8.0": "78a3bc05", "0.14.0": "29ac895b"},
    "start_flow": {"0.8.0": "87380a1d", "0.14.0": "36b38a64"},
    "create_flow": {"0.8.0": "71deb4e8", "0.10.0": "ed0cbc0a"},
    "ensure_workers": {"0.10.0": "d8a5aa43", "0.13.3": "35dfccd9"},
    "_compare_flow_shapes": {"0.10.0": "68696057", "0.14.0": "450a52e0"},
    "_create_flow_from_shape": {"0.10.0": "776cb053", "0.14.0": "5f381528"},
    "_get_flow_shape": {"0.10.0": "551d8eea", "0.14.0": "2f87d6bd"},
    "ensure_flow_compiled": {"0.10.0": "e3d05e8c", "0.11.0": "bc70a84a"},
    "calculate_retry_delay": {"0.8.0": "e2751c9a"},
    "get_run_with_states": {"0.8.0": "99cd6f6f"},
    "is_valid_slug": {"0.8.0": "8b8d8fe0"},
    "poll_for_tasks": {"0.8.0": "ce023c92"},
    "set_vt_batch": {"0.8.0": "a2c9b343"},
    "start_flow_with_states": {"0.8.0": "4aac0f5a"},
    "cleanup_ensure_workers_logs": {"0.10.0": "6734c5a2"},
    "delete_flow_and_data": {"0.10.0": "e22fd723"},
    "is_local": {"0.10.0": "c6daae7a"},
    "mark_worker_stopped": {"0.10.0": "2e2895e4"},
    "setup_ensure_workers_cron": {"0.10.0": "1fc7a4d4"},
    "track_worker_function": {"0.10.0": "c323591e"},
    "requeue_stalled_tasks": {"0.13.2": "33bacd04"},
    "setup_requeue_stalled_tasks_cron": {"0.13.2": "d1fdd567"},
    "cascade_resolve_conditions": {"0.14.0": "581d23e8"},
    "_cascade_force_skip_steps": {"0.14.0": "1e350c4a"},
    "_archive_task_message": {"0.14.0": "bb881eea"},
})
"""md5(prosrc) prefixes per function (fact sheet §2.5); add_step's two signatures never changed body
(8 arguments ccf0feb5, 12 arguments f387e169) and are keyed by argument count in :func:`expected_bodies`."""

_ADD_STEP_BODIES = {8: "ccf0feb5", 12: "f387e169"}

RELEASES: tuple[str, ...] = tuple(r for g in GROUPS for r in g.releases)
"""Every release recognition knows, oldest first."""


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@cache
def shape(group_index: int) -> Mapping[str, Mapping[str, str]]:
    """The catalog shape of ``GROUPS[group_index]``: ``{kind: {key: detail}}`` (cumulative)."""
    current: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
    for group in GROUPS[: group_index + 1]:
        for kind, keys in group.change.removed.items():
            for key in keys:
                del current[kind][key]
        for kind, objects in group.change.added.items():
            current[kind].update(objects)
    return MappingProxyType({kind: MappingProxyType(objects) for kind, objects in current.items()})


def expected_bodies(group_index: int) -> dict[str, str]:
    """``{function key: md5 prefix}`` a fresh build of ``GROUPS[group_index]`` has."""
    first = _version_key(GROUPS[group_index].releases[0])
    bodies = {}
    for key in shape(group_index)["function"]:
        name = key.split("(", 1)[0]
        if name == "add_step":
            bodies[key] = _ADD_STEP_BODIES[key.count(",") + 1]
            continue
        versions = BODY_MD5.get(name, {})
        applicable = [v for v in versions if _version_key(v) <= first]
        if applicable:
            bodies[key] = versions[max(applicable, key=_version_key)]
    return bodies


def group_of(release: str) -> int:
    """Index in :data:`GROUPS` of the group holding ``release`` (e.g. ``"0.8.1"``).

    Raises:
        KeyError: a release recognition does not know.
    """
    for index, group in enumerate(GROUPS):
        if release in group.releases:
            return index
    raise KeyError(release)


HISTORY_MARKERS: Mapping[str, int] = MappingProxyType({
    "20251104080523": 0, "20251209074533": 1, "20251212100113": 2, "20251225163110": 3,
    "20260103145141": 4, "20260120205547": 5, "20260124113408": 6, "20260214181656": 7,
})
"""Newest original migration timestamp in the Supabase CLI history -> index in :data:`GROUPS` (§3.2)."""


REPLACED_BY: Mapping[str, str] = MappingProxyType({"_archive_task_message": "_archive_task_messages"})
"""Upstream functions pgflow-cli's baseline replaces under another name (adoption drops them and
carries their grants over to the replacement)."""

OPTIONAL_FUNCTIONS: Mapping[str, str] = MappingProxyType({
    "prune_data_older_than(retention_interval interval)": "void",
})
"""Functions pgflow's documentation ships for installing by hand (fact sheet §7, pruning). Not part
of any release's shape: present or not, the schema is the release; adoption replaces them by
pgflow-cli's optional versions (``sql/optional``)."""
