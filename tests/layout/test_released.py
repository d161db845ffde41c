"""The released migrations 0001-0003 execute exactly the text they were released with.

The SHA-256 values below are those of the released files (computed on main before the SQL was
split into one file per function). A database records them in ``pgflow.schema_migrations``;
if the expansion of a released migration changed, every installed database would report the
migration as changed and refuse to upgrade. When a function file that a released migration
includes must change, the released text moves out of the way first (docs/architecture.md
"How to change a function").
"""

from __future__ import annotations

import pytest

from pgflow_cli import installer

RELEASED = {
    1: "24d9b44fbddf8dc55eb2de6cafd03b72a8603f2368a191d7fbf8a6711b2b68a6",
    2: "ef9f0294a4248c0e8de1e8ebe1223ea570e239624e8979e7b7c02a915cceef2c",
    3: "b75715a944ab9407ba68f3b906c1fa5dc6a23943ac3455ba90f311f449c3730c",
}


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_released_migration_text_is_unchanged(version):
    migration = next(m for m in installer.available_migrations() if m.version == version)
    assert migration.checksum == RELEASED[version], (
        f"{migration.path} no longer expands to its released text: a file it includes changed. "
        "Released migrations are frozen; see docs/architecture.md \"How to change a function\"."
    )
