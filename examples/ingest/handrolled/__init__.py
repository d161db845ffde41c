"""Document ingestion without pgflow step queues: the application's own PGMQ stage queues."""
