"""Bad input, fuzzed with hypothesis: fetch requests, write batches and config files.

Every case either gets a clear ``TypeError``/``ValueError`` (our errors subclass ``ValueError``)
or a defined answer checked against a reference, and a refused call leaves every stored byte as
it was (Redis keys of the project, offline parquet files, the registry). The module counts its
cases by outcome; ``pytest -s`` prints the counts at the end.

The store is a throwaway redis-server of its own for the module, so a snapshot scans a few
keys, not the shared server's keyspace.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pytest
import redis
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import ValidationError
from test_hardening_support import (
    DIM,
    THROWAWAY_PORT,
    VERSION,
    OwnedRedis,
    offline_snapshot,
    pair_frame,
    project_snapshot,
)

from solaris_feast.errors import ConfigError, WriteBatchError
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions
from solaris_feast.store.layout import stored_model_version
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
KNOWN_USER = 1
KNOWN_ITEMS = 20
CASES: Counter[str] = Counter()


class FuzzStore:
    def __init__(self, store: FeatureStore, client: redis.Redis, vectors: np.ndarray) -> None:
        self.store = store
        self.client = client
        self.vectors = vectors
        self.project = store.config.project
        # Records misses, so a refused request that reached the queue would show in a snapshot.
        self.retriever = SolarisRetriever(store, VERSION, deadline_ms=5000, record_misses=True)

    def snapshot(self) -> tuple[dict[bytes, str], dict[str, str]]:
        return project_snapshot(self.client, self.project), offline_snapshot(self.store)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzStore]:
    root = tmp_path_factory.mktemp("fuzz")
    server = OwnedRedis(THROWAWAY_PORT, root / "redis")
    server.start()
    try:
        project = f"solaris_hard_fuzz_{uuid.uuid4().hex[:8]}"
        store = open_store(project, root / "repo", online="redis", redis_url=server.url)
        store.apply(solaris_definitions().all())
        vectors = np.random.default_rng(5).standard_normal((KNOWN_ITEMS, DIM)).astype(np.float32)
        writer = EmbeddingWriter(store, "solaris_pair", offline=True)
        writer.write(pair_frame(KNOWN_USER, np.arange(KNOWN_ITEMS), vectors))
        writer.close()
        client = redis.Redis.from_url(server.url)
        fuzzed = FuzzStore(store, client, vectors)
        yield fuzzed
        client.close()
        fuzzed.retriever.close()
        print(f"\nhypothesis cases run: {dict(CASES)}")
    finally:
        server.stop()


# -- fetch requests ---------------------------------------------------------------------------

HUGE = 2**70
user_ids = st.one_of(
    st.integers(0, 3),
    st.integers(-HUGE, HUGE),
    st.sampled_from([2**63 - 1, 2**63, -1, np.int64(1), np.int32(2), np.uint64(2**63 + 1)]),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
)
item_ids = st.one_of(
    st.lists(st.integers(0, KNOWN_ITEMS + 10), max_size=60, unique=True),
    st.lists(st.integers(0, KNOWN_ITEMS + 10), min_size=2, max_size=60),
    st.lists(st.integers(-HUGE, HUGE), max_size=10),
    st.sampled_from([[2**63 - 1], [2**63], [-(2**63)], [], (), np.array([], dtype=np.int64)]),
    st.lists(st.floats(), max_size=5),
    st.lists(st.one_of(st.integers(0, 9), st.text(max_size=2), st.none()), max_size=5),
    st.lists(st.booleans(), max_size=5),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.none(),
    st.integers(),
    arrays(
        dtype=st.sampled_from([np.int64, np.int32, np.uint64, np.int8, np.float32, np.bool_]),
        shape=st.integers(0, 30),
    ),
    arrays(dtype=np.int64, shape=st.tuples(st.integers(1, 3), st.integers(1, 3))),
)


# Half well-formed requests (checked against the reference), half anything at all.
requests = st.one_of(
    st.tuples(
        st.integers(0, 3), st.lists(st.integers(0, KNOWN_ITEMS + 10), min_size=1, unique=True)
    ),
    st.tuples(user_ids, item_ids),
)


@settings(FUZZ, max_examples=100)
@given(request=requests)
@example(request=(2**63, [1, 2]))  # past int64: refused, not reported as a store failure
@example(request=(1, np.array([2**63 + 1], dtype=np.uint64)))
@example(request=(1, [3, 3]))
def test_fuzzed_fetch_requests_get_a_clear_error_or_the_reference_answer(
    fuzz_store: FuzzStore, request: tuple[Any, Any]
) -> None:
    user, items = request
    before = fuzz_store.snapshot()
    try:
        result = fuzz_store.retriever.fetch(user, items)
    except (TypeError, ValueError) as exc:
        CASES["fetch_refused"] += 1
        assert str(exc), "an error must say what is wrong"
        assert fuzz_store.snapshot() == before, "a refused fetch changed the store"
        return
    CASES["fetch_answered"] += 1
    requested = np.asarray(items).astype(np.int64)
    assert not result.error, "well-formed input must not be reported as a store failure"
    assert result.embeddings.shape == (len(requested), DIM)
    assert result.embeddings.dtype == np.float32 and result.tiers.dtype == np.int8
    known = (int(user) == KNOWN_USER) & (requested < KNOWN_ITEMS)
    expected_tiers = np.where(known, int(Tier.EXACT), int(Tier.ZERO))
    np.testing.assert_array_equal(result.tiers, expected_tiers)
    np.testing.assert_array_equal(result.embeddings[known], fuzz_store.vectors[requested[known]])
    assert not result.embeddings[~known].any()


@pytest.mark.parametrize("deadline_ms", [50.0, 30_000.0])
def test_a_100k_item_request_is_answered_or_flagged_never_raised(
    fuzz_store: FuzzStore, deadline_ms: float
) -> None:
    items = np.arange(100_000, dtype=np.int64)
    retriever = SolarisRetriever(
        fuzz_store.store, VERSION, deadline_ms=deadline_ms, record_misses=False
    )
    try:
        result = retriever.fetch(KNOWN_USER, items)
    finally:
        retriever.close()
    CASES["fetch_100k"] += 1
    assert result.embeddings.shape == (100_000, DIM) and result.tiers.shape == (100_000,)
    if result.error:  # past the deadline: ZERO for all, flagged
        assert deadline_ms < 30_000 and not result.tiers.any() and not result.embeddings.any()
    else:
        assert (result.tiers[:KNOWN_ITEMS] == Tier.EXACT).all()
        assert (result.tiers[KNOWN_ITEMS:] == Tier.ZERO).all()
        np.testing.assert_array_equal(result.embeddings[:KNOWN_ITEMS], fuzz_store.vectors)
    if deadline_ms >= 30_000:
        assert not result.error


# -- stored values ----------------------------------------------------------------------------

STORED_USER = 2**40 + 7  # no other test of this module reads or writes it
NOW_S = float(int(time.time()))
VERSION_TAG = stored_model_version(VERSION)


def _value(**field: Any) -> bytes:
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    return ValueProto(**field).SerializeToString()


def _reference_served(embedding: bytes, version: bytes, computed_at: bytes, ttl: float) -> bool:
    """Independent of the retriever's codecs: parse every field with Feast's proto, or miss."""
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto
    from google.protobuf.message import DecodeError

    parsed = []
    for raw in (embedding, version, computed_at):
        proto = ValueProto()
        try:
            proto.ParseFromString(raw)
        except DecodeError:
            return False
        parsed.append(proto)
    vector, model, stamp = parsed
    if vector.WhichOneof("val") != "float_list_val" or len(vector.float_list_val.val) != DIM:
        return False
    if not np.isfinite(np.asarray(vector.float_list_val.val)).all():
        return False
    # Online, solaris writes the version's tag; Feast's own writes (materialize) the version.
    if model.WhichOneof("val") != "string_val" or model.string_val not in (VERSION, VERSION_TAG):
        return False
    if stamp.WhichOneof("val") != "unix_timestamp_val":
        return False
    age = NOW_S - stamp.unix_timestamp_val
    return -300.0 <= age <= ttl


def _maybe_broken(valid: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """A valid value, a truncation or a one-byte mutation of it, or any bytes at all."""

    def flip(data: tuple[bytes, int, int]) -> bytes:
        raw, at, byte = data
        if not raw:
            return raw
        at %= len(raw)
        return raw[:at] + bytes([byte]) + raw[at + 1 :]

    return st.one_of(
        valid,  # listed thrice: a third of the examples store all three fields well-formed
        valid,
        valid,
        valid.flatmap(lambda raw: st.integers(0, len(raw)).map(lambda n: raw[:n])),
        st.tuples(valid, st.integers(0, 10_000), st.integers(0, 255)).map(flip),
        st.binary(min_size=1, max_size=200),
    )


floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
stored_embeddings = _maybe_broken(
    st.one_of(
        st.lists(st.floats(-1, 1, width=32), min_size=DIM, max_size=DIM),
        st.lists(st.floats(-1, 1, width=32), min_size=DIM, max_size=DIM),
        st.lists(floats32, min_size=DIM, max_size=DIM),  # NaN and inf among them
        st.lists(st.floats(-1, 1, width=32), min_size=0, max_size=DIM + 2),
    ).map(lambda v: _value(float_list_val={"val": v}))
    | st.just(_value(string_val="not a vector"))
)
stored_versions = _maybe_broken(
    st.sampled_from([VERSION, VERSION_TAG, "cmp-old", stored_model_version("cmp-old"), ""]).map(
        lambda v: _value(string_val=v)
    )
)
stored_stamps = _maybe_broken(
    st.sampled_from([0.0, 60.0, 6 * 3600.0, 6 * 3600.0 + 1, -299.0, -301.0, -1e9]).map(
        lambda age: _value(unix_timestamp_val=int(NOW_S - age))
    )
)


@settings(FUZZ, max_examples=150)
@given(embedding=stored_embeddings, version=stored_versions, computed_at=stored_stamps)
def test_fuzzed_stored_bytes_are_served_or_a_counted_miss_never_an_error(
    fuzz_store: FuzzStore,
    embedding: bytes,
    version: bytes,
    computed_at: bytes,
) -> None:
    from solaris_feast.store.layout import EntityKeyLayout, online_field

    key = EntityKeyLayout(["user_id", "item_id"], 3).key(STORED_USER, 0)
    fuzz_store.client.hset(
        key + fuzz_store.project.encode(),
        mapping={
            online_field("solaris_pair", "embedding"): embedding,
            online_field("solaris_pair", "model_version"): version,
            online_field("solaris_pair", "computed_at"): computed_at,
        },
    )
    retriever = SolarisRetriever(fuzz_store.store, VERSION, deadline_ms=5000, record_misses=False)
    before = fuzz_store.snapshot()
    with pytest.MonkeyPatch.context() as clock:
        clock.setattr(time, "time", lambda: NOW_S)  # the age boundaries are hit to the second
        try:
            result = retriever.fetch(STORED_USER, [0])
        finally:
            retriever.close()

    served = _reference_served(embedding, version, computed_at, 6 * 3600.0)
    CASES["stored_served" if served else "stored_missed"] += 1
    assert not result.error
    assert result.tiers.tolist() == [Tier.EXACT if served else Tier.ZERO]
    refused = retriever.stats.undecodable + sum(retriever.stats.rejected.values())
    # An empty value is no value (absent, as Redis answers a missing field), not a refusal.
    expected_refused = 0 if served or not embedding else 1
    assert refused == expected_refused, "a refused stored value must be counted once"
    if not served:
        assert not result.embeddings.any()
    assert fuzz_store.snapshot() == before, "a read changed what is stored"


# -- write batches ----------------------------------------------------------------------------

POISONS = [
    "nan",
    "inf",
    "wrong_dim",
    "text_embedding",
    "none_embedding",
    "nested_embedding",
    "float_item_id",
    "text_item_id",
    "object_user_id",
    "missing_column",
    "naive_timestamp",
    "missing_timestamp",
    "empty_version",
    "int_version",
    "duplicate_key",
    "negative_key",
    "not_a_frame",
]


def poisoned_batch(poisons: list[str], row: int, size_delta: int, column: str) -> Any:
    n = 6
    rng = np.random.default_rng(row)
    frame = pair_frame(
        2,
        np.arange(100, 100 + n),
        rng.standard_normal((n, DIM)).astype(np.float32),
        computed_at=pd.Timestamp("2026-01-01", tz="UTC"),
    )
    embeddings = list(frame["embedding"])
    for poison in poisons:
        if poison == "nan":
            if isinstance(embeddings[row], np.ndarray) and embeddings[row].size:
                poisoned = embeddings[row].astype(np.float64)
                poisoned.flat[row % poisoned.size] = np.nan
                embeddings[row] = poisoned
        elif poison == "inf":
            embeddings[row] = np.full(DIM, -np.inf if row % 2 else np.inf, dtype=np.float32)
        elif poison == "wrong_dim":
            embeddings[row] = np.zeros(max(DIM + size_delta, 0), dtype=np.float32)
        elif poison == "text_embedding":
            embeddings[row] = "0.1,0.2"
        elif poison == "none_embedding":
            embeddings[row] = None
        elif poison == "nested_embedding":
            embeddings[row] = np.zeros((2, DIM // 2), dtype=np.float32)
        elif poison == "float_item_id":
            frame["item_id"] = frame["item_id"].astype(np.float64)
        elif poison == "text_item_id":
            frame["item_id"] = frame["item_id"].astype(str)
        elif poison == "object_user_id":
            frame["user_id"] = pd.Series([2, "2", 2, 2, 2, 2], dtype=object)
        elif poison == "naive_timestamp":
            frame["computed_at"] = frame["computed_at"].dt.tz_localize(None)
        elif poison == "missing_timestamp":
            frame.loc[row, "computed_at"] = pd.NaT
        elif poison == "empty_version":
            frame.loc[row, "model_version"] = ""
        elif poison == "int_version":
            frame["model_version"] = frame["model_version"].astype(object)
            frame.loc[row, "model_version"] = 7
        elif poison == "duplicate_key":
            frame.loc[row, "item_id"] = frame.loc[(row + 1) % n, "item_id"]
        elif poison == "negative_key":
            frame.loc[row, "user_id"] = -3
    frame["embedding"] = pd.Series(embeddings, dtype=object)
    if "missing_column" in poisons:
        frame = frame.drop(columns=[column])
    if "not_a_frame" in poisons:
        return frame.to_dict(orient="list")
    return frame


@FUZZ
@given(
    poisons=st.lists(st.sampled_from(POISONS), max_size=3, unique=True),
    row=st.integers(0, 5),
    size_delta=st.integers(-DIM, 5).filter(lambda d: d != 0),
    column=st.sampled_from(["user_id", "item_id", "embedding", "model_version", "computed_at"]),
)
def test_fuzzed_write_batches_are_refused_whole_or_written_whole(
    fuzz_store: FuzzStore, poisons: list[str], row: int, size_delta: int, column: str
) -> None:
    batch = poisoned_batch(poisons, row, size_delta, column)
    writer = EmbeddingWriter(fuzz_store.store, "solaris_pair", offline=True)
    before = fuzz_store.snapshot()
    try:
        report = writer.write(batch)
    except (WriteBatchError, TypeError, ValueError) as exc:
        CASES["write_refused"] += 1
        assert poisons, f"a clean batch was refused: {exc}"
        assert fuzz_store.snapshot() == before, f"refused batch {poisons} changed the store"
        if isinstance(exc, WriteBatchError) and "missing columns" not in str(exc):
            assert exc.rows, "the error must name the bad rows"
        return
    finally:
        writer.close()
    CASES["write_accepted"] += 1
    assert not poisons, f"poisoned batch {poisons} was accepted: {report}"
    assert report.rows == 6 and report.online_applied == 6


# -- config files -----------------------------------------------------------------------------

INT_FIELDS = ["embedding_dim", "pair_ttl_seconds", "user_ttl_seconds", "similar_ttl_seconds"]
STR_FIELDS = ["pair_view_name", "fm_version", "compressor_version", "offline_root"]
config_edits = st.lists(
    st.one_of(
        st.tuples(st.just("unknown"), st.sampled_from(["ttl", "pair_ttl", "colour", "dim"])),
        st.tuples(st.sampled_from(INT_FIELDS), st.integers(1, 10**7)),
        st.tuples(st.sampled_from(STR_FIELDS), st.text(min_size=1, max_size=8)),
        st.tuples(
            st.sampled_from(INT_FIELDS),
            st.one_of(
                st.integers(-(2**40), 2**40),
                st.floats(allow_nan=True),
                st.text(max_size=6),
                st.lists(st.integers(), max_size=2),
                st.none(),
            ),
        ),
        st.tuples(
            st.sampled_from(STR_FIELDS),
            st.one_of(st.integers(), st.lists(st.text(), max_size=2), st.none(), st.text()),
        ),
    ),
    max_size=3,
)


@FUZZ
@given(edits=config_edits)
def test_fuzzed_solaris_config_files_are_refused_or_valid_and_apply(
    fuzz_store: FuzzStore, edits: list[tuple[str, Any]]
) -> None:
    document: dict[str, Any] = SolarisFeastConfig().model_dump()
    for field, value in edits:
        if field == "unknown":
            document[value] = 1
        else:
            document[field] = value
    text = yaml.safe_dump(document)
    registry = Path(str(fuzz_store.store.config.repo_path), "data", "registry.db")
    before = registry.read_bytes()
    try:
        config = SolarisFeastConfig.model_validate(yaml.safe_load(text))
        definitions = solaris_definitions(config)
    except (ValidationError, ValueError) as exc:
        CASES["config_refused"] += 1
        assert str(exc)
        assert registry.read_bytes() == before
        return
    CASES["config_accepted"] += 1
    # Whatever was accepted has the declared types and bounds.
    for name in INT_FIELDS:
        value = getattr(config, name)
        assert isinstance(value, int) and not isinstance(value, bool) and value > 0
    for name in STR_FIELDS:
        assert isinstance(getattr(config, name), str)
    assert all(
        view.ttl is not None and view.ttl.total_seconds() > 0 for view in definitions.stored_views()
    )


FEAST_YAML = """project: {project}
provider: local
registry:
  registry_type: file
  path: {registry}
online_store:
  type: redis
  connection_string: "127.0.0.1:{port}"
{online_extra}offline_store:
  type: file
entity_key_serialization_version: {version}
"""


@settings(FUZZ, max_examples=30)
@given(
    ttl=st.one_of(st.none(), st.integers(-(10**6), 10**6)),
    extra_key=st.sampled_from(["", "  bogus_option: 1\n", "  redis_type: redis\n"]),
    version=st.sampled_from(["3", "three", "-1", "2"]),
)
def test_fuzzed_feature_store_yaml_is_refused_before_anything_is_written(
    fuzz_store: FuzzStore,
    tmp_path_factory: pytest.TempPathFactory,
    ttl: int | None,
    extra_key: str,
    version: str,
) -> None:
    from feast import FeatureStore
    from feast.repo_config import FeastConfigError

    online_extra = extra_key + (f"  key_ttl_seconds: {ttl}\n" if ttl is not None else "")
    repo = tmp_path_factory.mktemp("yaml")
    config_file = repo / "feature_store.yaml"
    config_file.write_text(
        FEAST_YAML.format(
            project=fuzz_store.project,
            registry=Path(str(fuzz_store.store.config.repo_path), "data", "registry.db"),
            port=THROWAWAY_PORT,
            online_extra=online_extra,
            version=version,
        )
    )
    before = fuzz_store.snapshot()
    # Items far above the fetch test's range, so its reference answer stays true.
    batch = pair_frame(3, [200, 201], np.ones((2, DIM), dtype=np.float32))
    try:
        store = FeatureStore(repo_path=str(repo), fs_yaml_file=config_file)
        writer = EmbeddingWriter(store, "solaris_pair", offline=False)
        report = writer.write(batch)
        writer.close()
    except (FeastConfigError, ConfigError, ValidationError, ValueError) as exc:
        CASES["feast_yaml_refused"] += 1
        assert str(exc)
        assert fuzz_store.snapshot() == before
        bad = bool(extra_key.startswith("  bogus")) or version != "3" or (ttl or 0) < 0
        assert bad, f"a valid config was refused: {exc}"
        return
    CASES["feast_yaml_accepted"] += 1
    assert not extra_key.startswith("  bogus") and version == "3" and (ttl is None or ttl >= 0)
    assert report.online_applied == 2
