"""Content-addressed plan store (SQLite) for the REST service.

A plan is stored under the id of the request that produced it (sha256 of the canonical
JSON of the validated request), so the same request always maps to the same row and a
stored plan survives restarts.  Plans are kept as zlib-compressed canonical JSON.

The database path is the ``db_path`` argument, else ``$SLOTPLAN_DB``, else
``$XDG_CACHE_HOME/slotplan/plans.sqlite3`` (``~/.cache/slotplan/plans.sqlite3``).
Every operation opens its own short-lived connection, so the store is safe to use from
the threads of a thread pool and from several server processes (SQLite WAL mode).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import SlotplanError

ENV_DB = "SLOTPLAN_DB"
STORE_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    graph_name TEXT NOT NULL,
    graph_sha256 TEXT NOT NULL,
    params TEXT NOT NULL,
    request BLOB NOT NULL,
    plan BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreError(SlotplanError):
    pass


def default_db_path() -> Path:
    env = os.environ.get(ENV_DB)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "slotplan" / "plans.sqlite3"


@dataclass(frozen=True)
class StoredPlan:
    id: str
    created: float
    graph_name: str
    graph_sha256: str
    params: str
    request: dict[str, Any]
    plan_json: str

    @property
    def plan(self) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.plan_json)
        return obj


def _pack(obj: Mapping[str, Any] | str) -> bytes:
    text = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return zlib.compress(text.encode("utf-8"), 6)


def _unpack(blob: bytes) -> str:
    return zlib.decompress(blob).decode("utf-8")


class PlanStore:
    """SQLite-backed mapping ``id -> plan``."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as con:
                con.execute("PRAGMA journal_mode=WAL")
                con.executescript(_SCHEMA)
                con.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('version', ?)", (str(STORE_VERSION),)
                )
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open plan store {self.path}: {e}") from None

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(self.path, timeout=30.0)
        try:
            with con:  # commit on success, roll back on error
                yield con
        finally:
            con.close()

    def get(self, plan_id: str) -> StoredPlan | None:
        with self._connect() as con:
            row = con.execute(
                "SELECT id, created, graph_name, graph_sha256, params, request, plan FROM plans WHERE id = ?",
                (plan_id,),
            ).fetchone()
        if row is None:
            return None
        return StoredPlan(
            id=row[0],
            created=row[1],
            graph_name=row[2],
            graph_sha256=row[3],
            params=row[4],
            request=json.loads(_unpack(row[5])),
            plan_json=_unpack(row[6]),
        )

    def contains(self, plan_id: str) -> bool:
        with self._connect() as con:
            return con.execute("SELECT 1 FROM plans WHERE id = ?", (plan_id,)).fetchone() is not None

    def put(self, plan_id: str, request: Mapping[str, Any], plan: Mapping[str, Any] | str) -> StoredPlan:
        """Store a plan under ``plan_id``; the first plan stored for an id wins (the same
        request gives the same plan, so a concurrent duplicate is dropped)."""
        plan_json = plan if isinstance(plan, str) else json.dumps(plan, separators=(",", ":"), allow_nan=False)
        doc: Mapping[str, Any] = json.loads(plan_json) if isinstance(plan, str) else plan
        graph = doc.get("graph") or {}
        params = doc.get("params") or {}
        with self._connect() as con:
            con.execute(
                "INSERT OR IGNORE INTO plans(id, created, graph_name, graph_sha256, params, request, plan) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    plan_id,
                    time.time(),
                    str(graph.get("name", "")),
                    str(graph.get("sha256", "")),
                    str(params.get("name", "")),
                    _pack(request),
                    _pack(plan_json),
                ),
            )
        stored = self.get(plan_id)
        assert stored is not None
        return stored

    def delete(self, plan_id: str) -> bool:
        with self._connect() as con:
            cur = con.execute("DELETE FROM plans WHERE id = ?", (plan_id,))
            return cur.rowcount > 0

    def count(self) -> int:
        with self._connect() as con:
            row = con.execute("SELECT COUNT(*) FROM plans").fetchone()
        return int(row[0])

    def recent(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._connect() as con:
            rows = con.execute(
                "SELECT id, created, graph_name, graph_sha256, params FROM plans ORDER BY created DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {"id": r[0], "created": r[1], "graph": {"name": r[2], "sha256": r[3]}, "params": r[4]} for r in rows
        ]

    def page(self, limit: int, offset: int) -> tuple[int, list[dict[str, Any]]]:
        """(total, one page of plans newest first: id, created, graph {name, sha256}, params)."""
        with self._connect() as con:
            total = int(con.execute("SELECT COUNT(*) FROM plans").fetchone()[0])
            rows = con.execute(
                "SELECT id, created, graph_name, graph_sha256, params FROM plans ORDER BY created DESC, id "
                "LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return total, [
            {"id": r[0], "created": r[1], "graph": {"name": r[2], "sha256": r[3]}, "params": r[4]} for r in rows
        ]
