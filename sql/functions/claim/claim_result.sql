-- One row per message id a worker handed to claim_tasks.
--   outcome: claimed | duplicate | archived_terminal | archived_foreign | missing | fatal | released
--   reason:  stable code (NULL for claimed); see docs/claim-protocol.md
--   task fields: set when a task has this message's identity; input/flow_input only when claimed
CREATE TYPE pgflow.claim_result AS (
  outcome     text,
  message_id  bigint,
  reason      text,
  flow_slug   text,
  run_id      uuid,
  step_slug   text,
  task_index  integer,
  input       jsonb,
  flow_input  jsonb
);
