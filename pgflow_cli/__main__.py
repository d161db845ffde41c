"""Allow ``python -m pgflow_cli``."""

from pgflow_cli.cli import main

main()
