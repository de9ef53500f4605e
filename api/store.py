"""Content-addressed plan store (SQLite) for the REST service.

A plan is stored under the id of the request that produced it (sha256 of the canonical
JSON of the validated request), so the same request always maps to the same row and a
stored plan survives restarts.  Plans are kept as zlib-compressed canonical JSON.

The database path is the ``db_path`` argument, else ``$SLOTPLAN_DB``, else
``$XDG_CACHE_HOME/slotplan/plans.sqlite3`` (``~/.cache/slotplan/plans.sqlite3``).
Every operation opens its own short-lived connection, so the store is safe to use from
the threads of a thread pool and from several server processes (SQLite WAL mode).

Tenancy (store version 2): the ``plans`` table is a cache keyed by content (a request
planned once, whoever asked); what a client sees is the ``owned`` table, one row per
(owner, resource) with an id derived from the owner and the content id
(:func:`owned_id`), so one API key can neither read another's resources nor test whether
another key has planned a given graph.  ``owned.kind`` is ``"plan"`` today; evaluation
keys and weights use the same table and rule.  A version-1 database is migrated on open:
its plans become resources of the anonymous owner ``""`` (ids unchanged), which only an
admin key sees once API keys are configured.  Rendered plan pages (and the explanations
computed with them) are cached per content id in ``pages``; the ``rate`` table holds the
token buckets every server process on the database shares.
"""

from __future__ import annotations

import hashlib
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

from common.errors import SlotplanError

ENV_DB = "SLOTPLAN_DB"
STORE_VERSION = 2

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
CREATE TABLE IF NOT EXISTS owned (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS owned_by_owner ON owned(owner, kind, created);
CREATE INDEX IF NOT EXISTS owned_by_ref ON owned(ref);
CREATE TABLE IF NOT EXISTS pages (id TEXT PRIMARY KEY, html BLOB NOT NULL, explain BLOB);
CREATE TABLE IF NOT EXISTS rate (who TEXT PRIMARY KEY, tokens REAL NOT NULL, last REAL NOT NULL);
CREATE INDEX IF NOT EXISTS rate_by_last ON rate(last);
CREATE TABLE IF NOT EXISTS blobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    plan_ref TEXT,
    meta TEXT NOT NULL,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL
);
"""

PLAN = "plan"
KEYS = "keys"
WEIGHTS = "weights"
ANONYMOUS = ""


def owner_of_key(key: str) -> str:
    """The owner name of an API key (its sha256; the key itself is never stored)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def owned_id(owner: str, ref: str) -> str:
    """The id ``owner`` sees for the content ``ref``: ``ref`` itself for the anonymous owner
    (a service without API keys keeps its content-addressed ids), else a hash of both, which
    nobody without the owner's key can compute."""
    if owner == ANONYMOUS:
        return ref
    return hashlib.sha256(f"slotplan.owned/1\0{owner}\0{ref}".encode()).hexdigest()


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
class StoredBlob:
    """An uploaded resource kept on disk (an evaluation key set or a weights file): its
    content id, kind, the plan it was uploaded for (key sets), what was checked about it
    (``meta``), where it lies and its size."""

    id: str
    kind: str
    plan_ref: str | None
    meta: dict[str, Any]
    path: str
    bytes: int
    created: float


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
                row = con.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
                if row is not None and int(row[0]) < 2:
                    # version 1 had no owners: its plans become the anonymous owner's
                    con.execute("INSERT OR IGNORE INTO owned(id, owner, kind, ref, created) "
                                "SELECT id, '', 'plan', id, created FROM plans")
                con.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('version', ?)",
                            (str(STORE_VERSION),))
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

    # ---------------------------------------------------------------- owned resources

    def claim(self, owner: str, ref: str, kind: str = PLAN) -> str | None:
        """Give ``owner`` the stored plan ``ref`` (its id, or None when ``ref`` is not stored)."""
        oid = owned_id(owner, ref)
        with self._connect() as con:
            cur = con.execute(
                "INSERT OR IGNORE INTO owned(id, owner, kind, ref, created) "
                "SELECT ?, ?, ?, id, ? FROM plans WHERE id = ?", (oid, owner, kind, time.time(), ref))
            if cur.rowcount == 0 and con.execute("SELECT 1 FROM owned WHERE id = ?", (oid,)).fetchone() is None:
                return None
        return oid

    def put_owned(self, owners: list[str], plan_id: str, request: Mapping[str, Any],
                  plan: Mapping[str, Any] | str) -> StoredPlan:
        """:meth:`put` and give the plan to every owner, in one transaction."""
        plan_json = plan if isinstance(plan, str) else json.dumps(plan, separators=(",", ":"), allow_nan=False)
        doc: Mapping[str, Any] = json.loads(plan_json)
        graph = doc.get("graph") or {}
        params = doc.get("params") or {}
        now = time.time()
        with self._connect() as con:
            con.execute(
                "INSERT OR IGNORE INTO plans(id, created, graph_name, graph_sha256, params, request, plan) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (plan_id, now, str(graph.get("name", "")), str(graph.get("sha256", "")),
                 str(params.get("name", "")), _pack(request), _pack(plan_json)))
            con.executemany("INSERT OR IGNORE INTO owned(id, owner, kind, ref, created) VALUES (?, ?, ?, ?, ?)",
                            [(owned_id(o, plan_id), o, PLAN, plan_id, now) for o in sorted(set(owners))])
        stored = self.get(plan_id)
        assert stored is not None
        return stored

    def resolve(self, owner: str, oid: str, admin: bool = False, kind: str = PLAN) -> str | None:
        """The content id behind ``oid`` when ``owner`` owns it (any owner's, for an admin)."""
        with self._connect() as con:
            if admin:
                row = con.execute("SELECT ref FROM owned WHERE id = ? AND kind = ?", (oid, kind)).fetchone()
            else:
                row = con.execute("SELECT ref FROM owned WHERE id = ? AND kind = ? AND owner = ?",
                                  (oid, kind, owner)).fetchone()
        return None if row is None else str(row[0])

    def get_owned(self, owner: str, oid: str, admin: bool = False) -> StoredPlan | None:
        ref = self.resolve(owner, oid, admin)
        return None if ref is None else self.get(ref)

    def delete_owned(self, owner: str, oid: str, admin: bool = False) -> bool:
        """Delete ``owner``'s resource ``oid``; the content (and its page) goes with the last owner."""
        with self._connect() as con:
            q = "SELECT ref, owner FROM owned WHERE id = ? AND kind = ?" + ("" if admin else " AND owner = ?")
            row = con.execute(q, (oid, PLAN) if admin else (oid, PLAN, owner)).fetchone()
            if row is None:
                return False
            ref = row[0]
            con.execute("DELETE FROM owned WHERE id = ?", (oid,))
            if con.execute("SELECT 1 FROM owned WHERE ref = ? LIMIT 1", (ref,)).fetchone() is None:
                con.execute("DELETE FROM plans WHERE id = ?", (ref,))
                con.execute("DELETE FROM pages WHERE id = ?", (ref,))
        return True

    def page_owned(self, owner: str | None, limit: int, offset: int) -> tuple[int, list[dict[str, Any]]]:
        """(total, one page of ``owner``'s plans newest first; every owner's when ``owner`` is None)."""
        where, args = ("WHERE o.kind = 'plan'", []) if owner is None else (
            "WHERE o.kind = 'plan' AND o.owner = ?", [owner])
        with self._connect() as con:
            total = int(con.execute(f"SELECT COUNT(*) FROM owned o {where}", args).fetchone()[0])
            rows = con.execute(
                "SELECT o.id, o.created, p.graph_name, p.graph_sha256, p.params, o.owner FROM owned o "
                f"JOIN plans p ON p.id = o.ref {where} ORDER BY o.created DESC, o.id LIMIT ? OFFSET ?",
                [*args, limit, offset]).fetchall()
        items = []
        for r in rows:
            item: dict[str, Any] = {"id": r[0], "created": r[1], "graph": {"name": r[2], "sha256": r[3]},
                                    "params": r[4]}
            if owner is None:
                item["owner"] = r[5][:16]
            items.append(item)
        return total, items

    # ---------------------------------------------------------------- uploads (keys, weights)

    def put_blob(self, owner: str, kind: str, blob_id: str, plan_ref: str | None, meta: Mapping[str, Any],
                 path: str, nbytes: int) -> str:
        """Record an upload already durable at ``path`` and give it to ``owner``, in one
        transaction (committed before the service acknowledges it); returns its owned id."""
        oid = owned_id(owner, blob_id)
        now = time.time()
        with self._connect() as con:
            con.execute("PRAGMA synchronous=FULL")  # the commit reaches the disk before the 201
            con.execute("INSERT INTO blobs(id, kind, plan_ref, meta, path, bytes, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (blob_id, kind, plan_ref, json.dumps(dict(meta), sort_keys=True), path, int(nbytes), now))
            con.execute("INSERT INTO owned(id, owner, kind, ref, created) VALUES (?, ?, ?, ?, ?)",
                        (oid, owner, kind, blob_id, now))
        return oid

    def get_blob(self, owner: str, oid: str, kind: str, admin: bool = False) -> StoredBlob | None:
        ref = self.resolve(owner, oid, admin, kind)
        if ref is None:
            return None
        with self._connect() as con:
            row = con.execute("SELECT id, kind, plan_ref, meta, path, bytes, created FROM blobs WHERE id = ?",
                              (ref,)).fetchone()
        if row is None:
            return None
        return StoredBlob(id=row[0], kind=row[1], plan_ref=row[2], meta=json.loads(row[3]), path=row[4],
                          bytes=int(row[5]), created=float(row[6]))

    def delete_blob(self, owner: str, oid: str, kind: str, admin: bool = False) -> StoredBlob | None:
        """Forget ``owner``'s upload ``oid`` (committed); returns it so that the caller
        removes its files, or None when ``owner`` has no such upload."""
        blob = self.get_blob(owner, oid, kind, admin)
        if blob is None:
            return None
        with self._connect() as con:
            con.execute("DELETE FROM owned WHERE ref = ? AND kind = ?", (blob.id, kind))
            con.execute("DELETE FROM blobs WHERE id = ?", (blob.id,))
        return blob

    def blob_paths(self) -> set[str]:
        """The paths of every recorded upload (what a start-up sweep must keep)."""
        with self._connect() as con:
            return {str(r[0]) for r in con.execute("SELECT path FROM blobs").fetchall()}

    def blob_count(self, kind: str) -> int:
        with self._connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM blobs WHERE kind = ?", (kind,)).fetchone()[0])

    # ---------------------------------------------------------------- rendered pages

    def get_page(self, ref: str) -> str | None:
        with self._connect() as con:
            row = con.execute("SELECT html FROM pages WHERE id = ?", (ref,)).fetchone()
        return None if row is None else _unpack(row[0])

    def get_explain(self, ref: str) -> dict[str, Any] | None:
        with self._connect() as con:
            row = con.execute("SELECT explain FROM pages WHERE id = ?", (ref,)).fetchone()
        if row is None or row[0] is None:
            return None
        obj: dict[str, Any] = json.loads(_unpack(row[0]))
        return obj

    def put_page(self, ref: str, html: str, explain: Mapping[str, Any] | None) -> None:
        """Cache the page of the stored plan ``ref`` (nothing when the plan was deleted meanwhile)."""
        with self._connect() as con:
            con.execute("INSERT OR REPLACE INTO pages(id, html, explain) SELECT ?, ?, ? FROM plans WHERE id = ?",
                        (ref, _pack(html), None if explain is None else _pack(explain), ref))

    # ---------------------------------------------------------------- shared rate limits

    def take_token(self, who: str, rate_per_s: float, burst: float, now: float | None = None) -> float:
        """Token bucket shared by every process on this database: 0 when ``who`` may go on,
        else the seconds until a token is free.  Rows of buckets that have refilled are
        pruned (a full bucket and no row mean the same), so forgetting never resets a client
        that is over its limit."""
        now = time.time() if now is None else now
        full_after = burst / rate_per_s
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            row = con.execute("SELECT tokens, last FROM rate WHERE who = ?", (who,)).fetchone()
            tokens, last = (burst, now) if row is None else (float(row[0]), float(row[1]))
            tokens = min(burst, tokens + max(0.0, now - last) * rate_per_s)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / rate_per_s
            con.execute("INSERT OR REPLACE INTO rate(who, tokens, last) VALUES (?, ?, ?)", (who, tokens, now))
            if int(now * 1000) % 97 == 0:  # now and then, drop buckets that are full again
                con.execute("DELETE FROM rate WHERE last < ?", (now - full_after,))
        return wait

    def peek_token(self, who: str, rate_per_s: float, burst: float, now: float | None = None) -> float:
        """:meth:`take_token` without taking one: 0 when a token is free, else the wait."""
        now = time.time() if now is None else now
        with self._connect() as con:
            row = con.execute("SELECT tokens, last FROM rate WHERE who = ?", (who,)).fetchone()
        if row is None:
            return 0.0
        tokens = min(burst, float(row[0]) + max(0.0, now - float(row[1])) * rate_per_s)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate_per_s

    def rate_rows(self) -> int:
        with self._connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM rate").fetchone()[0])
