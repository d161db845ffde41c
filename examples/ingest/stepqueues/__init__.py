"""Document ingestion as one step-queued pgflow flow: one `pgflow worker --step` pool per stage."""
