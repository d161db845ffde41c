"""Operations: what each command does, as library functions returning plain dataclasses.

Modules here talk to the database through :mod:`pgflow_cli.db` and the SQL files, and never
print or exit; :mod:`pgflow_cli.cli` renders their results and maps errors to exit codes.
"""
