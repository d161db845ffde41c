"""Example applications built on pgflow-cli (see each package's README)."""
