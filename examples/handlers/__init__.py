"""A tour of what a handler can do, as one runnable flow (docs/handlers.md)."""
