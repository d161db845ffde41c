"""Document ingestion, written twice: hand-rolled PGMQ stages and one step-queued pgflow flow.

See examples/ingest/README.md.
"""
