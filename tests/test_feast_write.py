"""The write path: refusal of bad batches, newest-wins online writes, idempotent parquet log."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import redis

from solaris_feast.errors import WriteBatchError
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import (
    MODEL_VERSION_REQUEST_FIELD,
    SolarisFeastConfig,
    solaris_definitions,
)
from solaris_feast.store.layout import (
    EntityKeyLayout,
    FloatListCodec,
    stored_model_version,
    version_matches,
)
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 32
VERSION = "cmp-test-v1"


@pytest.fixture(params=["redis", "sqlite"])
def store(
    request: pytest.FixtureRequest, feast_project: str, tmp_path: Path, redis_url: str
) -> FeatureStore:
    feast_store = open_store(feast_project, tmp_path, online=request.param, redis_url=redis_url)
    feast_store.apply(solaris_definitions().all())
    return feast_store


def pair_batch(n: int = 4, user: int = 1, seed: int = 0, hours_ago: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "user_id": np.full(n, user, dtype=np.int64),
            "item_id": np.arange(100, 100 + n, dtype=np.int64),
            "embedding": list(rng.standard_normal((n, DIM)).astype(np.float32)),
            "model_version": VERSION,
            "computed_at": pd.Timestamp.now(tz="UTC").floor("s") - pd.Timedelta(hours=hours_ago),
        }
    )


def offline_files(store: FeatureStore) -> list[Path]:
    return sorted(Path(str(store.config.repo_path), "data", "offline").rglob("*.parquet"))


def poisoned(kind: str) -> tuple[pd.DataFrame, list[int]]:
    frame = pair_batch(5)
    if kind == "nan":
        frame.at[1, "embedding"] = np.full(DIM, np.nan, dtype=np.float32)
        return frame, [1]
    if kind == "inf":
        vec = np.zeros(DIM, dtype=np.float32)
        vec[3] = np.inf
        frame.at[3, "embedding"] = vec
        return frame, [3]
    if kind == "wrong_dim":
        frame.at[2, "embedding"] = np.zeros(DIM + 1, dtype=np.float32)
        frame.at[4, "embedding"] = np.zeros(8, dtype=np.float32)
        return frame, [2, 4]
    if kind == "duplicate_keys":
        frame.loc[3, "item_id"] = frame.loc[0, "item_id"]
        return frame, [0, 3]
    if kind == "negative_id":
        frame.loc[2, "user_id"] = -5
        return frame, [2]
    if kind == "empty_version":
        frame.loc[4, "model_version"] = ""
        return frame, [4]
    if kind == "version_not_a_string":  # None, and an unhashable list (checked row by row)
        frame["model_version"] = frame["model_version"].astype(object)
        frame.at[2, "model_version"] = None
        frame.loc[[4], "model_version"] = pd.Series([["v"]], index=[4], dtype=object)
        return frame, [2, 4]
    if kind == "from_the_future":  # a local time taken for UTC, a clock hours ahead
        frame.loc[1, "computed_at"] = pd.Timestamp.now(tz="UTC") + pd.Timedelta(hours=5)
        frame.loc[2, "computed_at"] = pd.Timestamp.now(tz="UTC") + pd.Timedelta(seconds=60)
        return frame, [1]  # row 2 is inside the clock skew serving allows
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "nan",
        "inf",
        "wrong_dim",
        "duplicate_keys",
        "negative_id",
        "empty_version",
        "version_not_a_string",
        "from_the_future",
    ],
)
def test_bad_batch_is_refused_naming_rows_and_nothing_is_written(
    store: FeatureStore, kind: str
) -> None:
    frame, bad_rows = poisoned(kind)
    writer = EmbeddingWriter(store, "solaris_pair")

    with pytest.raises(WriteBatchError) as caught:
        writer.write(frame)

    assert caught.value.rows == bad_rows
    assert "nothing written" in str(caught.value)
    assert offline_files(store) == []
    read = SolarisRetriever(store, VERSION, record_misses=False).fetch(1, frame["item_id"].unique())
    assert set(read.tiers.tolist()) == {Tier.ZERO}


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_lists_and_arrays_of_the_same_vectors_are_checked_alike(
    store: FeatureStore, kind: str
) -> None:
    """Rows of numpy vectors are checked as one matrix, anything else row by row: both paths
    must refuse the same rows and keep the same values."""
    writer = EmbeddingWriter(store, "solaris_pair")
    frame, bad_rows = poisoned(kind)
    as_lists = frame.assign(embedding=[v.tolist() for v in frame["embedding"]])
    for form in (frame, as_lists):
        with pytest.raises(WriteBatchError) as caught:
            writer.validate(form)
        assert caught.value.rows == bad_rows

    good = pair_batch(6)
    vectors = np.stack(good["embedding"])
    forms = [
        good,  # float32 arrays: the matrix path
        good.assign(embedding=list(vectors.astype(np.float64))),
        good.assign(embedding=[v.tolist() for v in vectors]),  # lists: the row path
        good.assign(embedding=[v.tolist() if i % 2 else v for i, v in enumerate(vectors)]),
    ]
    for form in forms:
        np.testing.assert_array_equal(writer.validate(form).embeddings, vectors)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop(columns=["computed_at"]), "missing columns"),
        (lambda f: f.assign(item_id=f["item_id"].astype(float)), "must be int64"),
        (lambda f: f.assign(computed_at=f["computed_at"].dt.tz_localize(None)), "timezone-aware"),
        (lambda f: f.assign(embedding=["x"] * len(f)), "not numeric"),
        # Finite, but float32 would store inf: said so, with no numpy overflow warning.
        (lambda f: f.assign(embedding=[np.full(32, 1e39)] * len(f)), "beyond float32's range"),
    ],
)
@pytest.mark.filterwarnings("error:overflow encountered:RuntimeWarning")
def test_malformed_columns_are_refused(
    store: FeatureStore, change: Callable[[pd.DataFrame], pd.DataFrame], message: str
) -> None:
    with pytest.raises(WriteBatchError, match=message):
        EmbeddingWriter(store, "solaris_pair").write(change(pair_batch(3)))
    assert offline_files(store) == []


def test_newer_write_is_never_lost_and_older_one_never_wins(store: FeatureStore) -> None:
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    first = pair_batch(2, seed=1, hours_ago=1)
    writer.write(first)

    # Same computed_at, new vectors (a retried shard, a fixed model): Feast would drop this.
    redo = first.assign(embedding=list(pair_batch(2, seed=2)["embedding"]))
    assert writer.write(redo).online_applied == 2
    np.testing.assert_array_equal(
        retriever.fetch(1, [100, 101]).embeddings, np.stack(redo["embedding"])
    )

    newer = pair_batch(2, seed=3, hours_ago=0)
    writer.write(newer)
    late_older = pair_batch(2, seed=4, hours_ago=2)
    assert writer.write(late_older).online_applied == 0
    np.testing.assert_array_equal(
        retriever.fetch(1, [100, 101]).embeddings, np.stack(newer["embedding"])
    )


def test_a_write_is_its_offline_half_then_its_online_half(store: FeatureStore) -> None:
    writer = EmbeddingWriter(store, "solaris_pair")
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    frame = pair_batch(3)

    staged = writer.write_offline(frame)

    # In the offline log and encoded, not yet online: the fill sends it from another thread.
    assert staged.rows == 3 and staged.offline_files_written == 1
    assert offline_files(store) == staged.offline_files
    assert retriever.fetch(1, [100, 101, 102]).tiers.tolist() == [Tier.ZERO] * 3

    report = writer.write_online(staged)

    assert report.online_applied == 3 and report.offline_files == staged.offline_files
    np.testing.assert_array_equal(
        retriever.fetch(1, [100, 101, 102]).embeddings, np.stack(frame["embedding"])
    )
    # write() is the two halves: the same batch again finds its file and rewrites online.
    again = writer.write(frame)
    assert (again.rows, again.online_applied, again.offline_files_written) == (3, 3, 0)
    with pytest.raises(WriteBatchError, match="NaN"):  # refused before anything is written
        writer.write_offline(poisoned("nan")[0])
    assert offline_files(store) == staged.offline_files


def test_feast_itself_drops_a_same_timestamp_rewrite_on_redis(
    feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    """The trap the write path exists for; if Feast fixes it this test tells us."""
    store = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    first = pair_batch(1, seed=1)
    as_feast = first.assign(
        event_timestamp=first["computed_at"],
        written_at=first["computed_at"],
        embedding=[v.tolist() for v in first["embedding"]],
    )
    store.write_to_online_store("solaris_pair", as_feast)
    redo = pair_batch(1, seed=2)
    store.write_to_online_store(
        "solaris_pair", as_feast.assign(embedding=[v.tolist() for v in redo["embedding"]])
    )
    stored = store.get_online_features(
        features=["solaris_pair:embedding"], entity_rows=[{"user_id": 1, "item_id": 100}]
    ).to_dict()["embedding"][0]
    np.testing.assert_array_equal(np.asarray(stored, np.float32), first["embedding"][0])


def test_a_truncated_offline_file_is_named_on_read_and_rewritten_by_the_same_batch(
    store: FeatureStore,
) -> None:
    """A file a crash left half-written: reading the window names it and says what to do
    (before: pyarrow's error, final, every later round); writing its batch again repairs it
    (before: skipped, since a file of that name existed)."""
    from solaris_feast.errors import ConfigError
    from solaris_feast.store.offline import read_offline_rows

    writer = EmbeddingWriter(store, "solaris_pair")
    frame = pair_batch(4)
    [path] = writer.write(frame).offline_files
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    at = frame["computed_at"].iloc[0]
    window = (at - pd.Timedelta(hours=1), at + pd.Timedelta(hours=1))
    with pytest.raises(ConfigError, match=r"not readable parquet.*move it aside"):
        read_offline_rows(store, "solaris_pair", *window)
    assert writer.write(frame).offline_files_written == 1
    assert len(read_offline_rows(store, "solaris_pair", *window)) == 4


def test_offline_log_is_partitioned_by_day_and_idempotent(store: FeatureStore) -> None:
    writer = EmbeddingWriter(store, "solaris_pair")
    frame = pair_batch(6)
    frame.loc[:2, "computed_at"] = pd.Timestamp("2026-01-02 23:30", tz="UTC")
    frame.loc[3:, "computed_at"] = pd.Timestamp("2026-01-03 00:30", tz="UTC")

    report = writer.write(frame)
    again = writer.write(frame.iloc[::-1].reset_index(drop=True))  # same rows, other order

    assert report.offline_files_written == 2 and again.offline_files_written == 0
    assert again.offline_files == report.offline_files
    assert [p.parent.name for p in offline_files(store)] == ["2026-01-02", "2026-01-03"]
    table = pd.concat([pq.read_table(p).to_pandas() for p in offline_files(store)])
    assert sorted(table["item_id"]) == sorted(frame["item_id"])
    assert len(table) == 6
    row = table.set_index("item_id").loc[103]
    np.testing.assert_array_equal(
        np.asarray(row["embedding"], np.float32), frame.at[3, "embedding"]
    )
    assert row["event_timestamp"] == pd.Timestamp("2026-01-03 00:30", tz="UTC")


def test_online_keeps_the_version_tag_offline_the_version_and_clients_ask_in_full(
    store: FeatureStore,
) -> None:
    """The online store holds an 8-character tag of the version (memory), the offline log the
    version itself; a plain Feast client asks the resolved view with the full version."""
    version = "compressor-20261201T120000-1a2b3c4d"  # a card version's shape and length
    frame = pair_batch(3).assign(model_version=version)
    EmbeddingWriter(store, "solaris_pair").write(frame)

    stored = store.get_online_features(
        features=["solaris_pair:model_version"],
        entity_rows=[{"user_id": 1, "item_id": 100}],
    ).to_dict()["model_version"]
    assert stored == [stored_model_version(version)] and len(stored[0]) == 8
    table = pd.concat([pq.read_table(p).to_pandas() for p in offline_files(store)])
    assert set(table["model_version"]) == {version}

    def resolved_tiers(asked: str) -> list[int]:
        rows = [
            {"user_id": 1, "item_id": int(i), MODEL_VERSION_REQUEST_FIELD: asked}
            for i in frame["item_id"]
        ]
        return store.get_online_features(
            features=["solaris_resolved:resolved_tier"], entity_rows=rows, full_feature_names=True
        ).to_dict()["solaris_resolved__resolved_tier"]

    assert resolved_tiers(version) == [int(Tier.EXACT)] * 3
    assert resolved_tiers("compressor-20261201T120000-ffffffff") == [int(Tier.ZERO)] * 3
    fetched = SolarisRetriever(store, version, record_misses=False).fetch(1, [100, 101, 102])
    assert fetched.tiers.tolist() == [Tier.EXACT] * 3


def test_version_matches_takes_the_tag_or_the_full_version_and_nothing_else() -> None:
    version = "compressor-20261201T120000-1a2b3c4d"
    tag = stored_model_version(version)
    stored = [tag, version, "other", None, 7, stored_model_version("other"), tag]
    assert version_matches(stored, version).tolist() == [1, 1, 0, 0, 0, 0, 1]
    # One expected version per row, as the resolved view's request column gives them.
    per_row = [version, version, "other", version, None, "other", ""]
    assert version_matches(stored, per_row).tolist() == [1, 1, 1, 0, 0, 1, 0]
    assert version_matches([], version).tolist() == []


def test_user_and_similar_writers_share_the_path(store: FeatureStore) -> None:
    rng = np.random.default_rng(5)
    user_vec, similar_vec = rng.standard_normal((2, DIM)).astype(np.float32)
    now = pd.Timestamp.now(tz="UTC")
    EmbeddingWriter(store, "solaris_user").write(
        pd.DataFrame(
            {
                "user_id": [3],
                "embedding": [user_vec],
                "pair_count": [7],
                "model_version": VERSION,
                "computed_at": now,
            }
        )
    )
    EmbeddingWriter(store, "solaris_similar").write(
        pd.DataFrame(
            {
                "user_id": [3],
                "item_id": [30],
                "embedding": [similar_vec],
                "neighbour_count": [5],
                "mean_distance": [0.125],
                "model_version": VERSION,
                "computed_at": now,
            }
        )
    )
    with pytest.raises(WriteBatchError, match="missing columns"):
        EmbeddingWriter(store, "solaris_similar").write(
            pd.DataFrame({"user_id": [3], "item_id": [31], "embedding": [similar_vec]})
        )

    feast_read = store.get_online_features(
        features=["solaris_similar:neighbour_count", "solaris_similar:mean_distance"],
        entity_rows=[{"user_id": 3, "item_id": 30}],
    ).to_dict()
    assert feast_read["neighbour_count"] == [5]
    assert feast_read["mean_distance"] == [0.125]
    result = SolarisRetriever(store, VERSION, record_misses=False).fetch(3, [30, 31])
    assert result.tiers.tolist() == [Tier.SIMILAR, Tier.USER_AGG]
    np.testing.assert_array_equal(result.embeddings, np.stack([similar_vec, user_vec]))


def test_byte_layouts_match_feasts_own_encoders() -> None:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import FloatList
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    rng = np.random.default_rng(9)
    layout = EntityKeyLayout(["user_id", "item_id"], 3)
    for user, item in rng.integers(0, 2**62, size=(50, 2)).tolist():
        proto = EntityKey(
            join_keys=["user_id", "item_id"],
            entity_values=[ValueProto(int64_val=user), ValueProto(int64_val=item)],
        )
        assert layout.key(user, item) == serialize_entity_key(proto, 3)
    codec = FloatListCodec(DIM)
    for vec in rng.standard_normal((20, DIM)).astype(np.float32):
        encoded = ValueProto(float_list_val=FloatList(val=vec.tolist())).SerializeToString()
        assert codec.encode(vec) == encoded
        np.testing.assert_array_equal(codec.decode(encoded), vec)
    assert (
        codec.decode(ValueProto(float_list_val=FloatList(val=[1.0] * 8)).SerializeToString())
        is None
    )


def test_a_failing_write_script_is_reported_on_redis(
    feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    import redis

    feast_store = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    feast_store.apply(solaris_definitions().all())
    writer = EmbeddingWriter(feast_store, "solaris_pair", offline=False)
    frame = pair_batch(3)
    version = feast_store.config.entity_key_serialization_version
    layout = EntityKeyLayout(["user_id", "item_id"], version)
    # Someone else's plain string under the second row's key: HGET on it fails in the script.
    client = redis.Redis.from_url(redis_url)
    client.set(layout.key(1, 101) + feast_project.encode(), b"not a hash")
    with pytest.raises(redis.ResponseError, match="solaris_pair: a write script failed"):
        writer.write(frame)
    assert client.get(layout.key(1, 101) + feast_project.encode()) == b"not a hash"
    writer.close()


def test_a_crashed_writes_temp_file_is_removed_by_the_next_write_there(store: FeatureStore) -> None:
    """A write killed between its temp file and the rename leaves ``.part-*.tmp`` behind:
    never read, but never removed either. The next write to the folder removes an old one and
    leaves a young one (another writer's, about to be renamed)."""
    import os
    import time

    writer = EmbeddingWriter(store, "solaris_pair")
    writer.write(pair_batch(2, seed=1))
    [first] = offline_files(store)
    stale = first.with_name(".part-crashed.parquet.0123.tmp")
    young = first.with_name(".part-live.parquet.4567.tmp")
    for temp in (stale, young):
        temp.write_bytes(b"half a file")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    writer.write(pair_batch(2, seed=2))
    writer.close()
    assert not stale.exists() and young.exists()
    assert len(offline_files(store)) == 2


def test_the_redis_write_script_keeps_the_newer_timestamp_on_every_encoding(
    redis_url: str,
) -> None:
    """The script compares stored and new ``_ts`` protobufs itself, by a 5-byte fast path for
    seconds from 1978 to 3058 and a varint loop for everything else (no seconds field, fewer or
    more bytes, nanos): each pair of times is decided as Python orders them."""
    from google.protobuf.timestamp_pb2 import Timestamp

    from solaris_feast.store.backends.redis import WRITE_SCRIPT

    times = [
        (0, 0),
        (0, 7),
        (5, 0),
        (2**28 - 1, 999_999_999),  # 4 varint bytes, just below the fast path
        (2**28, 0),  # the fast path's first second
        (1_764_900_000, 0),
        (1_764_900_000, 1),
        (1_764_900_000, 999_999_999),
        (1_764_900_001, 0),
        (2**35 - 1, 0),  # its last second
        (2**35, 0),  # 6 bytes
    ]
    client = redis.Redis.from_url(redis_url)
    key = f"solaris_test_write_script:{os.getpid()}"
    try:
        for stored in times:
            for new in times:
                client.delete(key)
                client.hset(
                    key, "_ts", Timestamp(seconds=stored[0], nanos=stored[1]).SerializeToString()
                )
                new_ts = Timestamp(seconds=new[0], nanos=new[1]).SerializeToString()
                applied = client.eval(WRITE_SCRIPT, 1, key, "_ts", 1, 0, "value", new_ts, b"v")
                assert applied == int(new >= stored), (stored, new)
                assert client.hget(key, "value") == (b"v" if new >= stored else None)
    finally:
        client.delete(key)


@pytest.mark.parametrize(("skew_seconds", "refused"), [(None, False), (30.0, True)])
def test_a_row_ahead_of_the_clock_is_judged_by_the_repos_own_skew(
    feast_project: str, tmp_path: Path, skew_seconds: float | None, refused: bool
) -> None:
    """The writer reads the clock skew from the repo's resolved view when a row is ahead of the
    clock: 2 minutes ahead is within the default 5 minutes, not within a repo's 30 s."""
    config = (
        SolarisFeastConfig()
        if skew_seconds is None
        else SolarisFeastConfig(clock_skew_seconds=skew_seconds)
    )
    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(solaris_definitions(config).all())
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    ahead = pair_batch(2).assign(computed_at=pd.Timestamp.now(tz="UTC") + pd.Timedelta(minutes=2))
    writer.write(pair_batch(2, user=2))  # rows at the clock are written either way
    if refused:
        with pytest.raises(WriteBatchError, match="30 s after this machine's clock"):
            writer.write(ahead)
    else:
        assert writer.write(ahead).online_applied == 2
