    -- The columns of a fence_disable / fence_restore result row that come from the function's
    -- worker_functions row (v_wf) and its fence (v_fence), set before RETURN NEXT.
    enabled := v_wf.enabled;
    fence_id := v_fence.fence_id;
    fenced_at := v_fence.fenced_at;
    fenced_by := v_fence.fenced_by;
    fence_reason := v_fence.reason;
