--@note Protocol-1 baseline: pgflow.prune_data_older_than as sql/optional/prune_baseline.sql installs it on
--@note the baseline; 0003 upgrades it in place. Frozen: only prune_baseline.sql includes it. The current
--@note version, and the lines this file reuses, are in functions/maintenance/prune_data_older_than.sql.
--@include functions/maintenance/prune_data_older_than.sql lines=1-29
  v_flow text;
--@include functions/maintenance/prune_data_older_than.sql lines=31-75
  -- Baseline queue naming: one queue per flow, named like the flow.
  FOR v_flow IN SELECT f.flow_slug FROM pgflow.flows AS f ORDER BY f.flow_slug LOOP
    v_table := pgmq.format_table_name(v_flow, 'a');
--@include functions/maintenance/prune_data_older_than.sql lines=79-97
