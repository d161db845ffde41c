"""``rows`` / ``one`` / ``val`` on ``self.conn``: the plain-SQL helpers of the test drivers."""

from __future__ import annotations

from typing import Any

import psycopg


class RowQueries:
    """Mixin for a test driver whose ``conn`` returns dict rows (``row_factory = dict_row``)."""

    conn: psycopg.Connection

    def rows(self, query: Any, params: Any = None) -> list[dict]:
        """Every row of ``query``."""
        return self.conn.execute(query, params).fetchall()

    def one(self, query: Any, params: Any = None) -> dict | None:
        """The first row of ``query`` (``None`` when there is none)."""
        return self.conn.execute(query, params).fetchone()

    def val(self, query: Any, params: Any = None) -> Any:
        """The first column of the first row (``None`` when there is no row)."""
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else next(iter(row.values()))
