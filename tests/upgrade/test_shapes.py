"""The frozen shapes of sql/shapes are what fresh installs build: baseline.json what migrations 0001
and 0002 leave, head.json what every shipped migration leaves. ``PGFLOW_FREEZE_SHAPES=1`` rewrites them
from those installs (after a migration changes a table; review the diff)."""

from __future__ import annotations

import json
import os

import pytest

from pgflow_cli import sqlfiles
from pgflow_cli.installer import shapes
from pgflow_cli.installer.catalog import read_schema_facts


@pytest.mark.parametrize("name", shapes.SHAPES)
def test_each_frozen_shape_is_what_a_fresh_install_builds(request, name):
    database = request.getfixturevalue("baseline_db" if name == "baseline" else "db")
    with database.connect() as conn:
        facts = read_schema_facts(conn)
    if os.environ.get("PGFLOW_FREEZE_SHAPES") == "1":
        path = sqlfiles.sql_root() / "shapes" / f"{name}.json"
        path.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        shapes.shape.cache_clear()
    assert shapes.shape(name) == facts
    assert shapes.runtime_breaks(shapes.shape(name), facts) == []
