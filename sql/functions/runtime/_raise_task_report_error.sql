-- Raises the error of one element of a batch report (complete_tasks, fail_tasks) as the single
-- call raised it, so a caller handles a batch's errors as the single call's: the same SQLSTATE,
-- detail and hint; the message prefixed "<p_function>(): element <p_element>: " (p_element: the
-- 0-based index of the element being applied; NULL: the batch's closing archive call) and ending
-- "; nothing was applied" (the whole call rolls back). Never returns.
CREATE OR REPLACE FUNCTION pgflow._raise_task_report_error(p_function text, p_element integer, p_sqlstate text,
                                                           p_message text, p_detail text, p_hint text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_message text := pg_catalog.format('%s(): %s%s; nothing was applied', p_function,
                                      coalesce('element ' || p_element || ': ', 'archiving the messages: '), p_message);
BEGIN
  IF p_detail <> '' AND p_hint <> '' THEN
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = v_message, DETAIL = p_detail, HINT = p_hint;
  ELSIF p_detail <> '' THEN
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = v_message, DETAIL = p_detail;
  ELSIF p_hint <> '' THEN
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = v_message, HINT = p_hint;
  END IF;
  RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = v_message;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._raise_task_report_error(text, integer, text, text, text, text) FROM PUBLIC;
