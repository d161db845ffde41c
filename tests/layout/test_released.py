"""The migration rule: released migrations are byte-frozen; at most one unreleased migration exists.

The SHA-256 values below are those of the released files. A database records them in
``pgflow.schema_migrations``; if a released file changed, every installed database would report
the migration as changed and refuse to upgrade.
"""

from __future__ import annotations

import pytest

from pgflow_cli import installer

RELEASED = {
    1: "24d9b44fbddf8dc55eb2de6cafd03b72a8603f2368a191d7fbf8a6711b2b68a6",
    2: "ef9f0294a4248c0e8de1e8ebe1223ea570e239624e8979e7b7c02a915cceef2c",
    3: "8b0772a8dad8d4c44bd773ca0268863e837a15cfb88ffa56ba90f07388274090",
}


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_a_released_migration_is_byte_for_byte_what_was_released(version):
    migration = next(m for m in installer.available_migrations() if m.version == version)
    assert migration.checksum == RELEASED[version], (
        f"sql/{migration.path} changed: a released migration never changes (docs/architecture.md \"SQL layout\"); "
        "put the change into the unreleased migration instead")
    assert installer.RELEASED_CHECKSUMS[migration.path] == RELEASED[version]


def test_the_installer_knows_exactly_the_released_migrations():
    assert {m.version: m.checksum for m in installer.available_migrations() if m.released} == RELEASED


def test_at_most_one_migration_is_unreleased_and_it_is_the_newest():
    migrations = installer.available_migrations()
    unreleased = [m.label for m in migrations if not m.released]
    assert len(unreleased) <= 1, (
        f"two unreleased migrations {unreleased}: while nothing is released, every change goes into the one "
        "unreleased migration (docs/architecture.md \"SQL layout\")")
    assert all(m.released for m in migrations[:-1]), "only the newest migration may be unreleased"
