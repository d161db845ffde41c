------------------------------------------------------------------------------------------------
-- The claim protocol (spec "Message classification and unexpected work"; docs/claim-protocol.md)
------------------------------------------------------------------------------------------------

--@include functions/claim/claim_result.sql

--@include released/0003/functions/claim/claim_tasks.sql as-create
