  -- The variables fence_disable and fence_restore both declare: the names they lock (in name
  -- order), who runs the call (_fence_origin), and the worker_functions and fences rows of the
  -- function the loop is at.
  v_names text[];
  v_origin record;
  v_wf pgflow.worker_functions;
  v_fence pgflow.fences;
