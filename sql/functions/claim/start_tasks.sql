-- Protocol-1 claim: refused (a task is addressed by (queue_name, message_id) now).
CREATE OR REPLACE FUNCTION pgflow.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)
RETURNS SETOF pgflow.step_task_record
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
BEGIN
  RAISE EXCEPTION 'worker % speaks pgflow protocol 1 (start_tasks), database speaks protocol 2: nothing was claimed',
    start_tasks.worker_id
    USING ERRCODE = 'PF002',
          HINT = 'stop this worker and deploy one speaking protocol 2 (it claims with pgflow.claim_tasks)';
END;
$$;
