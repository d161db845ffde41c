-- What a claim hands to a worker (upstream-compatible field order).
CREATE TYPE pgflow.step_task_record AS (
  flow_slug   text,
  run_id      uuid,
  step_slug   text,
  input       jsonb,
  msg_id      bigint,
  task_index  integer,
  flow_input  jsonb
);
