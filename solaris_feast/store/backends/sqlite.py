"""SQLite, the embedded default: Feast's tables ``<project>_<view>`` (one row per entity key and
feature) in the online store's database file.

Reads: one ``UNION ALL`` statement over the three tables (split when N passes SQLite's limit of
bound variables). The deadline bounds the read itself: the busy wait for a writer's lock is at
most what is left of it, and a progress handler interrupts a statement that runs past it.

Writes: one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE excluded.event_ts >= event_ts`` per
batch, in one transaction (all-or-nothing). Feast's own SQLite writer overwrites
unconditionally, so an older late write would win there; here newest wins, ties to the later.

Miss queue: one table ``solaris_miss_queue`` beside Feast's, primary key
``(project, user_id, item_id)``; ``INSERT OR IGNORE`` is the dedupe and draining deletes the rows.
A consumer-group read (a precompute round) marks its rows taken (``taken_group``,
``taken_by``, ``taken_at_ms``) instead of deleting them, and the round acknowledges (deletes)
them after its writes, as the Redis stream's group does: a round that dies between the two
leaves its pairs queued for its own retry, or for a later round once they have been idle for
``min_idle_ms``. One group at a time: a row taken in one group is taken for every group.
A read that misses pairs already queued (the same user scrolling on within a round) finds them
with a ``SELECT`` on the key and opens no write transaction: a commit costs an fsync (about 2 ms
on this machine's disk, far more under load) and takes the database's write lock, which every
serving process and the writer share.

Status: read-only connection (reading the status must never write to or lock Feast's tables).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from solaris_feast.columns import COMPUTED_AT, EMBEDDING, MODEL_VERSION
from solaris_feast.errors import DeadlineExceededError, ViewsNotAppliedError, is_retryable
from solaris_feast.store.backends import (
    READ_FEATURES,
    BackendKind,
    OnlineBatch,
    OnlineFacts,
    QueuedMiss,
    ReadsOneRequestAtATime,
    StoredScan,
    StoredValues,
    TierRead,
    TierReads,
    online_facts,
)
from solaris_feast.store.ids import EntityId, decode_id, encode_id
from solaris_feast.store.layout import (
    DEFAULT_TRANSACTIONS_IN_FLIGHT,
    SolarisKeyLayouts,
    check_serialization_version,
    quoted_sqlite_table,
)
from solaris_feast.tiers import SEARCH_ORDER, Tier

if TYPE_CHECKING:
    from feast import FeatureStore

NANOS_PER_SECOND = 1_000_000_000
DEFAULT_TIMEOUT_SECONDS = 30.0
QUEUE_LOCK_WAIT_SECONDS = 0.005
"""Longest wait for the write lock when :meth:`SqliteBackend.record_misses` queues misses: it
runs on the request path after the read, and a writer (a precompute batch) holds the lock for
as long as its transaction lasts, so waiting the backend's timeout held each request up to its
whole deadline (1 s through the resolved view) for a best-effort write. A locked queue raises
at once; the caller counts the error and serves what it read."""
_PROGRESS_STEPS = 1000
"""SQLite VM instructions between two deadline checks (microseconds each)."""


def sqlite_path(store: FeatureStore | OnlineFacts) -> str:
    """The online store's database file (a relative path resolves against the repo)."""
    return online_facts(store).sqlite_path


_TAKEN_COLUMNS = (("taken_group", "TEXT"), ("taken_by", "TEXT"), ("taken_at_ms", "INTEGER"))
"""The miss queue's consumer-group columns: NULL while a row is untaken."""


def _queue_value(value: EntityId) -> int | str:
    # Int ids are stored as integers (as before); string ids in their JSON text form, which
    # never looks numeric, so the columns' INTEGER affinity cannot turn "007" into 7.
    return int(value) if not isinstance(value, str) else encode_id(value)


def _queue_id(stored: int | str) -> EntityId:
    return stored if isinstance(stored, int) else decode_id(stored)


def _no_such_table(exc: sqlite3.OperationalError) -> bool:
    return "no such table" in str(exc)


class SqliteBackend(ReadsOneRequestAtATime, SolarisKeyLayouts):
    """Feast's SQLite online store (see the module docstring for layout and atomicity).

    Args:
        path: the database file.
        project: the Feast project.
        serialization_version: Feast's ``entity_key_serialization_version``.
        timeout_seconds: the longest a lock wait of a write or a queue operation may take.
        repo: the repo folder, named in errors.
    """

    kind: BackendKind = "sqlite"
    reads_miss_round = False

    def __init__(
        self,
        path: str,
        project: str,
        serialization_version: int = 3,
        *,
        timeout_seconds: float | None = DEFAULT_TIMEOUT_SECONDS,
        repo: str | None = None,
    ) -> None:
        self.path = path
        self.project = project
        self.timeout_seconds = (
            DEFAULT_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
        )
        self.repo = repo or str(Path(path).parent)
        check_serialization_version(serialization_version)
        self.serialization_version = serialization_version
        self._conn: sqlite3.Connection | None = None
        self._queue_ready = False

    @classmethod
    def for_store(
        cls, store: FeatureStore | OnlineFacts, timeout_seconds: float | None
    ) -> SqliteBackend:
        facts = online_facts(store)
        return cls(
            facts.sqlite_path,
            facts.project,
            facts.serialization_version,
            timeout_seconds=timeout_seconds,
            repo=facts.repo,
        )

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # Our own connection: Feast's is created lazily and shared with its writes.
            self._conn = sqlite3.connect(
                self.path, check_same_thread=False, timeout=self.timeout_seconds
            )
        return self._conn

    def _missing_views(self, exc: sqlite3.OperationalError, views: Sequence[str]) -> Exception:
        return ViewsNotAppliedError(
            self.repo,
            list(views),
            where=f"the SQLite online store {self.path} has no table ({exc}) for feature view",
        )

    # -- reading ------------------------------------------------------------------------------

    def read_tiers(
        self, user: EntityId, items: np.ndarray, views: Mapping[Tier, str], deadline_s: float
    ) -> TierReads:
        conn = self._connection()
        deadline_ms = (deadline_s - time.perf_counter()) * 1000.0
        if deadline_ms <= 0:
            raise DeadlineExceededError("SQLite read", 0.0)
        pair_keys = [self.pair_key.key(user, item) for item in items.tolist()]
        user_key = self.user_key.key(user)
        # Two IN lists (pair, similar) and the user key per statement.
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        step = max((limit - 1) // 2, 1)
        # A writer's lock is waited for at most until the deadline; a statement that runs past
        # it is interrupted.
        conn.set_progress_handler(lambda: int(time.perf_counter() > deadline_s), _PROGRESS_STEPS)
        rows: list[Any] = []
        try:
            with self._busy_wait(conn, deadline_ms / 1000.0):
                for start in range(0, len(pair_keys), step):
                    part = pair_keys[start : start + step]
                    rows += self._read_statement(conn, part, user_key, views)
                    if time.perf_counter() > deadline_s:
                        raise DeadlineExceededError("SQLite read", deadline_ms)
        except sqlite3.OperationalError as exc:
            if _no_such_table(exc):
                raise self._missing_views(exc, [views[t] for t in SEARCH_ORDER]) from exc
            # Interrupted by the progress handler, or a writer's lock held past the busy wait:
            # either way the deadline ran out.
            if is_retryable(exc) and time.perf_counter() >= deadline_s - 0.001:
                raise DeadlineExceededError("SQLite read", deadline_ms) from exc
            raise
        finally:
            conn.set_progress_handler(None, _PROGRESS_STEPS)
        position = {key: i for i, key in enumerate(pair_keys)}
        n = len(items)
        columns: dict[Tier, dict[str, list[bytes | None]]] = {
            tier: {f: [None] * n for f in READ_FEATURES} for tier in SEARCH_ORDER
        }
        user_values: dict[str, bytes] = {}
        for tier_value, key, feature, value in rows:
            tier = Tier(tier_value)
            if tier == Tier.USER_AGG:
                user_values[feature] = value
            else:
                columns[tier][feature][position[key]] = value
        for feature, value in user_values.items():
            columns[Tier.USER_AGG][feature] = [value] * n
        return TierReads(
            {
                tier: TierRead(
                    columns[tier][EMBEDDING],
                    columns[tier][MODEL_VERSION],
                    columns[tier][COMPUTED_AT],
                )
                for tier in SEARCH_ORDER
            }
        )

    def _read_statement(
        self,
        conn: sqlite3.Connection,
        pair_keys: list[bytes],
        user_key: bytes,
        views: Mapping[Tier, str],
    ) -> list[Any]:
        marks = ",".join("?" * len(pair_keys))
        statements = []
        params: list[Any] = []
        for tier in SEARCH_ORDER:
            table = quoted_sqlite_table(self.project, views[tier])
            keys = [user_key] if tier == Tier.USER_AGG else pair_keys
            where = "entity_key = ?" if tier == Tier.USER_AGG else f"entity_key IN ({marks})"
            statements.append(
                f"SELECT {int(tier)}, entity_key, feature_name, value FROM {table} "
                f"WHERE {where} AND feature_name IN ('embedding', 'model_version', 'computed_at')"
            )
            params.extend(keys)
        return conn.execute(" UNION ALL ".join(statements), params).fetchall()

    # -- writing ------------------------------------------------------------------------------

    def write_batch(
        self,
        batch: OnlineBatch,
        *,
        chunk_rows: int,
        atomic_rows: int,
        in_flight: int = DEFAULT_TRANSACTIONS_IN_FLIGHT,
    ) -> int:
        """The whole batch in one transaction (``chunk_rows``, ``atomic_rows`` and
        ``in_flight`` are Redis's)."""
        import pandas as pd
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        conn = self._connection()
        table = quoted_sqlite_table(self.project, batch.view_name)
        # Feast stores event_ts as whole unix seconds (its registered datetime adapter).
        sql = (
            f"INSERT INTO {table} (entity_key, feature_name, value, value_text, event_ts, "
            "created_ts) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(entity_key, feature_name) DO "
            "UPDATE SET value = excluded.value, value_text = excluded.value_text, "
            "event_ts = excluded.event_ts, created_ts = excluded.created_ts "
            f"WHERE excluded.event_ts >= {table}.event_ts"
        )
        now_seconds = int(pd.Timestamp.now(tz="UTC").timestamp())
        text_cache: dict[bytes, str | None] = {}

        def value_text(raw: bytes) -> str | None:
            # Feast fills value_text for strings and numbers (helpers.extract_text_and_num).
            if raw not in text_cache:
                proto = ValueProto()
                proto.ParseFromString(raw)
                kind = proto.WhichOneof("val")
                text_cache[raw] = (
                    str(getattr(proto, kind))
                    if kind in ("string_val", "int64_val", "int32_val", "double_val", "float_val")
                    else None
                )
            return text_cache[raw]

        names = batch.feature_names
        params = []
        for key, row, nanos in zip(
            batch.keys.tolist(), batch.rows(), batch.event_ts_ns.tolist(), strict=True
        ):
            seconds = int(nanos) // NANOS_PER_SECOND
            for name, raw in zip(names, row, strict=True):
                text = None if name == EMBEDDING else value_text(raw)
                params.append((key, name, raw, text, seconds, now_seconds))
        try:
            with conn:
                before = conn.total_changes
                conn.executemany(sql, params)
                changed = conn.total_changes - before
        except sqlite3.OperationalError as exc:
            if _no_such_table(exc):
                raise self._missing_views(exc, [batch.view_name]) from exc
            raise
        return changed // len(names)

    # -- miss queue ---------------------------------------------------------------------------

    def _queue(self) -> sqlite3.Connection:
        conn = self._connection()
        if not self._queue_ready:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS solaris_miss_queue ("
                "project TEXT NOT NULL, user_id INTEGER NOT NULL, item_id INTEGER NOT NULL, "
                "model_version TEXT NOT NULL, missed_at INTEGER NOT NULL, "
                "taken_group TEXT, taken_by TEXT, taken_at_ms INTEGER, "
                "PRIMARY KEY (project, user_id, item_id))"
            )
            # A queue made before consumer groups: its rows are untaken; add the columns.
            have = {row[1] for row in conn.execute("PRAGMA table_info(solaris_miss_queue)")}
            for column, kind in _TAKEN_COLUMNS:
                if column not in have:
                    try:
                        conn.execute(f"ALTER TABLE solaris_miss_queue ADD COLUMN {column} {kind}")
                    except sqlite3.OperationalError as exc:
                        # Another process opening the old queue added it between the two.
                        if "duplicate column name" not in str(exc):
                            raise
            conn.commit()
            self._queue_ready = True
        return conn

    def record_misses(
        self,
        user: EntityId,
        items: Sequence[EntityId],
        model_version: str,
        *,
        now: int,
        round_ttl_seconds: int,
        max_stream_length: int,
    ) -> int:
        conn = self._queue()
        stored_user = _queue_value(user)
        wanted = list(dict.fromkeys(_queue_value(item) for item in items))
        # The queue's reads and write run on the request path after the read: they must not
        # wait out the read's whole deadline for a writer's lock (the misses are best effort; a
        # locked database drops them at once and the caller counts a miss_queue_error).
        with self._busy_wait(conn, min(self.timeout_seconds, QUEUE_LOCK_WAIT_SECONDS)):
            # Pairs already queued are found by a read, so a repeated miss writes nothing.
            queued: set[int | str] = set()
            step = max(conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 2, 1)
            for start in range(0, len(wanted), step):
                part = wanted[start : start + step]
                queued.update(
                    row[0]
                    for row in conn.execute(
                        "SELECT item_id FROM solaris_miss_queue WHERE project = ? AND "
                        f"user_id = ? AND item_id IN ({','.join('?' * len(part))})",
                        [self.project, stored_user, *part],
                    )
                )
            fresh = [item for item in wanted if item not in queued]
            if not fresh:
                return 0
            with conn:
                before = conn.total_changes
                # OR IGNORE still: another process may queue the same pair between the two.
                conn.executemany(
                    "INSERT OR IGNORE INTO solaris_miss_queue "
                    "(project, user_id, item_id, model_version, missed_at) VALUES (?, ?, ?, ?, ?)",
                    [(self.project, stored_user, item, model_version, now) for item in fresh],
                )
                return conn.total_changes - before

    @contextmanager
    def _busy_wait(self, conn: sqlite3.Connection, seconds: float) -> Iterator[None]:
        """A lock is waited for at most ``seconds`` inside the block; the backend's own
        timeout (writes, the queue's group reads) is restored after it, on every path."""
        conn.execute(f"PRAGMA busy_timeout = {max(int(seconds * 1000), 1)}")
        try:
            yield
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_seconds * 1000)}")

    def drain_misses(self, max_pairs: int) -> list[QueuedMiss]:
        conn = self._queue()
        with conn:
            rows = conn.execute(
                "SELECT user_id, item_id, model_version, missed_at FROM solaris_miss_queue "
                "WHERE project = ? ORDER BY missed_at, rowid LIMIT ?",
                (self.project, max_pairs),
            ).fetchall()
            conn.executemany(
                "DELETE FROM solaris_miss_queue WHERE project = ? AND user_id = ? AND item_id = ?",
                [(self.project, r[0], r[1]) for r in rows],
            )
        return [QueuedMiss(_queue_id(r[0]), _queue_id(r[1]), str(r[2]), int(r[3])) for r in rows]

    def pending_misses(self) -> int:
        # A count is a read: it must not create the database file nor the queue table (the
        # status of a store that was never written reads 0, and leaves no online.db behind).
        if self._conn is None and not Path(self.path).is_file():
            return 0
        try:
            row = (
                self._connection()
                .execute(
                    "SELECT COUNT(*) FROM solaris_miss_queue WHERE project = ?", (self.project,)
                )
                .fetchone()
            )
        except sqlite3.OperationalError as exc:
            if _no_such_table(exc):
                return 0
            raise
        return int(row[0])

    def clear_miss_queue(self) -> int:
        if self._conn is None and not Path(self.path).is_file():
            return 0
        conn = self._connection()
        try:
            deleted = conn.execute(
                "DELETE FROM solaris_miss_queue WHERE project = ?", (self.project,)
            ).rowcount
            conn.commit()
        except sqlite3.OperationalError as exc:
            if _no_such_table(exc):
                return 0
            raise
        return int(deleted)

    def read_miss_group(
        self, group: str, consumer: str, max_pairs: int, min_idle_ms: int
    ) -> list[QueuedMiss]:
        """As Redis's group read: the consumer's own taken rows first (a retried round gets
        back what its failed try took), then rows another consumer has held for at least
        ``min_idle_ms``, then untaken rows, oldest first; each marked taken by ``consumer``.
        ``entry_id`` is the row's rowid."""
        conn = self._queue()
        now_ms = int(time.time() * 1000)
        columns = "rowid, user_id, item_id, model_version, missed_at"
        with conn:
            # BEGIN IMMEDIATE: two rounds reading at once must not take the same rows.
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(
                f"SELECT {columns} FROM solaris_miss_queue WHERE project = ? AND "
                "taken_group = ? AND taken_by = ? ORDER BY missed_at, rowid LIMIT ?",
                (self.project, group, consumer, max_pairs),
            ).fetchall()
            if len(rows) < max_pairs:
                rows += conn.execute(
                    f"SELECT {columns} FROM solaris_miss_queue WHERE project = ? AND "
                    "taken_by IS NOT NULL AND NOT (taken_group = ? AND taken_by = ?) AND "
                    "taken_at_ms <= ? ORDER BY missed_at, rowid LIMIT ?",
                    (self.project, group, consumer, now_ms - min_idle_ms, max_pairs - len(rows)),
                ).fetchall()
            if len(rows) < max_pairs:
                rows += conn.execute(
                    f"SELECT {columns} FROM solaris_miss_queue WHERE project = ? AND "
                    "taken_by IS NULL ORDER BY missed_at, rowid LIMIT ?",
                    (self.project, max_pairs - len(rows)),
                ).fetchall()
            conn.executemany(
                "UPDATE solaris_miss_queue SET taken_group = ?, taken_by = ?, taken_at_ms = ? "
                "WHERE rowid = ?",
                [(group, consumer, now_ms, r[0]) for r in rows],
            )
        return [
            QueuedMiss(_queue_id(r[1]), _queue_id(r[2]), str(r[3]), int(r[4]), str(r[0]))
            for r in rows
        ]

    def retire_consumer(self, group: str, consumer: str) -> bool:
        """True when ``consumer`` holds no rows (there is no consumer list to leave)."""
        row = (
            self._queue()
            .execute(
                "SELECT COUNT(*) FROM solaris_miss_queue WHERE project = ? AND "
                "taken_group = ? AND taken_by = ?",
                (self.project, group, consumer),
            )
            .fetchone()
        )
        return int(row[0]) == 0

    def ack_misses(self, group: str, taken: Sequence[QueuedMiss]) -> int:
        # The pair as well as the rowid: SQLite may hand a deleted rowid to a new row, and a
        # pair queued again after its ack is untaken, so neither is deleted by mistake.
        keys = []
        for miss in taken:
            if miss.entry_id is None:
                raise ValueError("ack needs the entry_id of each pair, as read_group returns it")
            keys.append(
                (
                    int(miss.entry_id),
                    self.project,
                    _queue_value(miss.user_id),
                    _queue_value(miss.item_id),
                    group,
                )
            )
        if not keys:
            return 0
        conn = self._queue()
        with conn:
            before = conn.total_changes
            conn.executemany(
                "DELETE FROM solaris_miss_queue WHERE rowid = ? AND project = ? AND user_id = ? "
                "AND item_id = ? AND taken_group = ?",
                keys,
            )
            return conn.total_changes - before

    # -- status -------------------------------------------------------------------------------

    def scan(self, views: Mapping[Tier, str], max_keys: int, scan_count: int) -> StoredScan:
        path = Path(self.path)
        if not path.is_file():
            return StoredScan([], 0, False)
        layouts = {
            Tier.EXACT: self.pair_key,
            Tier.SIMILAR: self.pair_key,
            Tier.USER_AGG: self.user_key,
        }
        rows: list[StoredValues] = []
        truncated = False
        keys_read = 0
        # Read-only: reading the status must never write to or lock Feast's serving tables.
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=self.timeout_seconds)
        try:
            for tier in SEARCH_ORDER:
                table = quoted_sqlite_table(self.project, views[tier])
                budget = max_keys - keys_read
                try:
                    (total,) = conn.execute(
                        f"SELECT COUNT(DISTINCT entity_key) FROM {table}"
                    ).fetchone()
                    found = conn.execute(
                        f"SELECT entity_key, feature_name, value FROM {table} "
                        "WHERE feature_name IN ('model_version', 'computed_at') AND entity_key IN "
                        f"(SELECT DISTINCT entity_key FROM {table} ORDER BY entity_key LIMIT ?)",
                        (max(budget, 0),),
                    ).fetchall()
                except sqlite3.OperationalError as exc:
                    if not _no_such_table(exc):
                        raise
                    continue  # `feast apply` makes the table: without it nothing is stored
                truncated = truncated or total > budget
                by_key: dict[bytes, dict[str, bytes]] = {}
                for key, feature, value in found:
                    by_key.setdefault(bytes(key), {})[feature] = value
                keys_read += len(by_key)
                for key, values in by_key.items():
                    decoded = layouts[tier].decode(key)
                    if decoded is not None:
                        rows.append(
                            StoredValues(
                                tier,
                                decoded,
                                values.get(MODEL_VERSION),
                                values.get(COMPUTED_AT),
                            )
                        )
        finally:
            conn.close()
        return StoredScan(rows, keys_read, truncated)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._queue_ready = False
