"""Quantized embeddings (float16, int8 with a per-vector scale) stored as Feast bytes.

The codec is chosen in the view config, written into every view's tags and decoded by the one
decoder of ``store/layout.py``, which the retriever calls and the resolved view carries as text.
Pinned here on a real SQLite and a real Redis: the retriever and a plain Feast
``get_online_features`` on the resolved view read back the same vectors, equal to the codec's
round trip of what was written and within its error bound of the float32 vectors; bytes of the
wrong size or garbage are a miss (ZERO when no other tier has the pair), never an error.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pytest
import redis
from feast.protos.feast.types.Value_pb2 import Value as ValueProto

from solaris_feast.columns import COMPUTED_AT, EMBEDDING, ITEM_ID, MODEL_VERSION, USER_ID
from solaris_feast.errors import ConfigError, WriteBatchError
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.backends import online_kind
from solaris_feast.store.backends.sqlite import sqlite_path
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import (
    MODEL_VERSION_REQUEST_FIELD,
    SolarisFeastConfig,
    solaris_definitions,
)
from solaris_feast.store.layout import (
    EntityKeyLayout,
    FloatListCodec,
    QuantizedCodec,
    dequantize_payloads,
    embedding_codec,
    online_field,
    sqlite_table,
)
from solaris_feast.store.tags import TAG_EMBEDDING_CODEC
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 32
VERSION = "codec-v1"
ITEMS = 6
RESOLVED = [
    "solaris_resolved:resolved_embedding",
    "solaris_resolved:resolved_tier",
]


def reference_round_trip(codec: str, vectors: np.ndarray) -> np.ndarray:
    """The obviously right dequantization, written out per row."""
    out = np.zeros_like(vectors)
    for i, row in enumerate(vectors.astype(np.float64)):
        if codec == "float16":
            out[i] = row.astype(np.float16).astype(np.float32)
        else:
            scale = np.float32(np.abs(row).max() / 127.0)
            q = np.clip(np.rint(row / scale), -127, 127) if scale > 0 else np.zeros(DIM)
            out[i] = q.astype(np.int8).astype(np.float32) * scale
    return out


@pytest.mark.parametrize("codec", ["float16", "int8"])
def test_quantized_codec_matches_a_per_row_reference_within_its_error_bound(codec: str) -> None:
    rng = np.random.default_rng(11)
    vectors = (rng.standard_normal((200, DIM)) * rng.uniform(0.01, 20, (200, 1))).astype(np.float32)
    vectors[0] = 0.0  # an all-zero vector has scale 0 and must come back as zeros
    coder = embedding_codec(codec, DIM)
    assert isinstance(coder, QuantizedCodec)
    encoded = coder.encode_rows(vectors)
    back = coder.decode_packed(encoded)
    np.testing.assert_allclose(back, reference_round_trip(codec, vectors), rtol=0, atol=1e-6)
    assert (np.abs(back - vectors) <= coder.tolerance(vectors)[:, None]).all()
    assert np.array_equal(back[0], np.zeros(DIM))
    # Each value is Feast's own bytes_val encoding of the payload.
    proto = ValueProto()
    proto.ParseFromString(encoded[3])
    assert proto.WhichOneof("val") == "bytes_val"
    np.testing.assert_array_equal(coder.decode(encoded[3]), back[3])


@pytest.mark.parametrize("codec", ["float16", "int8"])
def test_payloads_of_the_wrong_size_or_type_do_not_decode(codec: str) -> None:
    coder = embedding_codec(codec, DIM)
    assert isinstance(coder, QuantizedCodec)
    (good,) = coder.payloads(np.ones((1, DIM), np.float32))
    vectors, decoded = dequantize_payloads(
        # The last payload is a float list, not bytes: the wrong type on purpose.
        [good, good[:-1], good + b"\0", None, b"", [1.0] * DIM],  # type: ignore[list-item]
        codec,
        DIM,
    )
    assert decoded.tolist() == [True, False, False, False, False, False]
    assert not vectors[1:].any()
    other = "int8" if codec == "float16" else "float16"
    assert coder.decode(embedding_codec(other, DIM).encode_rows(np.ones((1, DIM)))[0]) is None
    assert coder.decode(b"\xff\x00garbage") is None
    float32 = embedding_codec("float32", DIM)
    assert isinstance(float32, FloatListCodec)
    assert coder.decode(float32.encode(np.ones(DIM))) is None


def test_float16_refuses_vectors_beyond_its_range_at_write(tmp_path: Path) -> None:
    store = open_store("sp_codec_range", tmp_path, online="sqlite")
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_codec="float16")).all())
    vectors = np.ones((2, DIM), np.float32)
    vectors[1, 3] = 1e6
    with pytest.raises(WriteBatchError, match="float16"):
        EmbeddingWriter(store, "solaris_pair", offline=False).write(pair_frame(vectors))


def test_views_carry_the_codec_tag_and_the_matching_feast_type() -> None:
    from feast.types import Array, Bytes, Float32

    for codec, dtype in (("float32", Array(Float32)), ("int8", Bytes), ("float16", Bytes)):
        definitions = solaris_definitions(SolarisFeastConfig(embedding_codec=codec))
        for view in definitions.stored_views():
            assert view.tags[TAG_EMBEDDING_CODEC] == codec
            assert next(f.dtype for f in view.features if f.name == EMBEDDING) == dtype
        assert definitions.resolved_view.tags[TAG_EMBEDDING_CODEC] == codec


def pair_frame(vectors: np.ndarray, user: int = 1, items: list[int] | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            USER_ID: user,
            ITEM_ID: items if items is not None else list(range(len(vectors))),
            EMBEDDING: list(vectors),
            MODEL_VERSION: VERSION,
            COMPUTED_AT: pd.Timestamp.now(tz="UTC").floor("s") - pd.Timedelta(seconds=30),
        }
    )


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def quantized_store(
    backend: str, codec: str, project: str, tmp_path: Path, redis_url: str
) -> FeatureStore:
    store = open_store(project, tmp_path, online=backend, redis_url=redis_url)  # type: ignore[arg-type]
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_codec=codec)).all())
    return store


def resolved_view(store: FeatureStore, user: int, items: list[int]) -> dict[str, Any]:
    answer = store.get_online_features(
        features=RESOLVED,
        entity_rows=[
            {USER_ID: user, ITEM_ID: i, MODEL_VERSION_REQUEST_FIELD: VERSION} for i in items
        ],
        full_feature_names=True,
    ).to_dict()
    return {
        "vectors": np.asarray(answer["solaris_resolved__resolved_embedding"], dtype=np.float32),
        "tiers": answer["solaris_resolved__resolved_tier"],
    }


@pytest.mark.parametrize("codec", ["float16", "int8"])
def test_quantized_pairs_round_trip_through_the_retriever_and_feasts_resolved_view(
    backend: str, codec: str, feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    store = quantized_store(backend, codec, feast_project, tmp_path, redis_url)
    rng = np.random.default_rng(5)
    exact = rng.standard_normal((4, DIM)).astype(np.float32) * 3
    similar = rng.standard_normal((1, DIM)).astype(np.float32)
    user_mean = rng.standard_normal((1, DIM)).astype(np.float32)
    EmbeddingWriter(store, "solaris_pair").write(pair_frame(exact))
    EmbeddingWriter(store, "solaris_similar", offline=False).write(
        pair_frame(similar, items=[4]).assign(neighbour_count=3, mean_distance=0.2)
    )
    EmbeddingWriter(store, "solaris_user", offline=False).write(
        pair_frame(user_mean, items=[0]).drop(columns=[ITEM_ID]).assign(pair_count=4)
    )
    items = list(range(ITEMS))  # 0-3 exact, 4 similar, 5 user aggregate
    expected = reference_round_trip(codec, np.vstack([exact, similar, user_mean]))

    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    fetched = retriever.fetch(1, items)
    assert fetched.tiers.tolist() == [Tier.EXACT] * 4 + [Tier.SIMILAR, Tier.USER_AGG]
    np.testing.assert_allclose(fetched.embeddings, expected, rtol=0, atol=1e-6)
    assert retriever.stats.undecodable == 0

    viewed = resolved_view(store, 1, items)
    assert viewed["tiers"] == fetched.tiers.tolist()
    np.testing.assert_array_equal(viewed["vectors"], fetched.embeddings)

    # A plain read of the stored view hands out the codec's bytes, decodable by its tag.
    plain = store.get_online_features(
        features=["solaris_pair:embedding"], entity_rows=[{USER_ID: 1, ITEM_ID: 0}]
    ).to_dict()
    tag = store.get_feature_view("solaris_pair").tags[TAG_EMBEDDING_CODEC]
    decoded, ok = dequantize_payloads(plain[EMBEDDING], tag, DIM)
    assert ok.all()
    np.testing.assert_array_equal(decoded[0], fetched.embeddings[0])
    retriever.close()


@pytest.mark.parametrize("codec", ["float16", "int8"])
def test_feast_materialize_of_a_quantized_view_stores_what_the_writer_stores(
    codec: str, feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    """The offline log of a quantized view holds the codec's bytes under ``embedding`` (the
    feature's Feast type) and the float32 beside them: ``feast materialize`` (a backfill after
    the online store lost its data) stored null embeddings from the float lists before, and
    said nothing. Feast's point-in-time read returns the same bytes; training reads float32."""
    from solaris_feast.store.offline import read_offline_rows

    store = quantized_store("sqlite", codec, feast_project, tmp_path, redis_url)
    vectors = np.random.default_rng(7).standard_normal((4, DIM)).astype(np.float32) * 2
    frame = pair_frame(vectors)
    EmbeddingWriter(store, "solaris_pair", online=False).write(frame)
    rows = [{USER_ID: 1, ITEM_ID: i} for i in range(4)]
    assert resolved_view(store, 1, list(range(4)))["tiers"] == [Tier.ZERO] * 4

    at = frame[COMPUTED_AT].iloc[0]
    store.materialize(at - pd.Timedelta(hours=1), at + pd.Timedelta(minutes=1), ["solaris_pair"])
    stored = store.get_online_features(features=["solaris_pair:embedding"], entity_rows=rows)
    expected = QuantizedCodec(codec, DIM).payloads(vectors)
    assert stored.to_dict()[EMBEDDING] == expected
    viewed = resolved_view(store, 1, list(range(4)))
    assert viewed["tiers"] == [Tier.EXACT] * 4
    np.testing.assert_allclose(
        viewed["vectors"], reference_round_trip(codec, vectors), rtol=0, atol=1e-6
    )

    entity_df = pd.DataFrame(rows).assign(event_timestamp=at + pd.Timedelta(seconds=1))
    history = store.get_historical_features(
        entity_df=entity_df, features=["solaris_pair:embedding"]
    ).to_df()
    assert sorted(history[EMBEDDING].tolist()) == sorted(expected)
    logged = read_offline_rows(
        store, "solaris_pair", at - pd.Timedelta(hours=1), at, [ITEM_ID, EMBEDDING]
    ).sort_values(ITEM_ID)
    np.testing.assert_array_equal(np.stack(logged[EMBEDDING].to_list()), vectors)


def write_raw(store: FeatureStore, view: str, key: bytes, value: bytes) -> None:
    """Overwrite one stored embedding with bytes the writer would never produce."""
    project = store.config.project
    if online_kind(store) == "redis":
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        client.hset(key + project.encode(), online_field(view, EMBEDDING), value)
        return
    with contextlib.closing(sqlite3.connect(sqlite_path(store))) as conn:
        updated = conn.execute(
            f'UPDATE "{sqlite_table(project, view)}" SET value = ? '
            "WHERE entity_key = ? AND feature_name = ?",
            (value, key, EMBEDDING),
        ).rowcount
        conn.commit()
    assert updated == 1


@pytest.mark.parametrize("codec", ["float16", "int8"])
def test_bad_quantized_bytes_are_a_counted_miss_served_zero_not_an_error(
    backend: str,
    codec: str,
    feast_project: str,
    tmp_path: Path,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = quantized_store(backend, codec, feast_project, tmp_path, redis_url)
    vectors = np.random.default_rng(2).standard_normal((4, DIM)).astype(np.float32)
    EmbeddingWriter(store, "solaris_pair", offline=False).write(pair_frame(vectors))
    key = EntityKeyLayout([USER_ID, ITEM_ID], 3).key
    coder = embedding_codec(codec, DIM)
    assert isinstance(coder, QuantizedCodec)
    (good,) = coder.payloads(vectors[:1])
    wrong_size = ValueProto(bytes_val=good[:-3]).SerializeToString()
    other_codec = embedding_codec("int8" if codec == "float16" else "float16", DIM)
    write_raw(store, "solaris_pair", key(1, 1), wrong_size)
    write_raw(store, "solaris_pair", key(1, 2), other_codec.encode_rows(vectors[2:3])[0])
    write_raw(store, "solaris_pair", key(1, 3), b"\x0a\xff\xffnot a value")  # not a proto

    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    with caplog.at_level("WARNING", logger="solaris_feast.serving.retriever"):
        fetched = retriever.fetch(1, [0, 1, 2, 3])
    assert not fetched.error
    assert fetched.tiers.tolist() == [Tier.EXACT, Tier.ZERO, Tier.ZERO, Tier.ZERO]
    assert not fetched.embeddings[1:].any()
    assert retriever.stats.undecodable == 3
    assert any(f"not {codec} embeddings" in r.getMessage() for r in caplog.records)

    # Feast's resolved view: a bytes value of the wrong size is a miss (ZERO); bytes that are
    # not a Feast value at all fail Feast's own read first (pinned in test_resolve_parity).
    viewed = resolved_view(store, 1, [0, 1, 2])
    assert viewed["tiers"] == [Tier.EXACT, Tier.ZERO, Tier.ZERO]
    assert not viewed["vectors"][1:].any()
    np.testing.assert_array_equal(viewed["vectors"][0], fetched.embeddings[0])
    retriever.close()


def test_retriever_refuses_views_that_disagree_on_the_codec(tmp_path: Path) -> None:
    from solaris_feast.errors import ConfigError

    store = open_store("sp_codec_mixed", tmp_path, online="sqlite")
    int8 = solaris_definitions(SolarisFeastConfig(embedding_codec="int8"))
    plain = solaris_definitions(SolarisFeastConfig())
    store.apply([int8.user, int8.item, int8.pair_view, plain.similar_view, plain.user_view])
    with pytest.raises(ConfigError, match="codec"):
        SolarisRetriever(store, VERSION, record_misses=False)


def test_a_round_configured_for_int8_stores_int8_and_a_mismatch_is_refused(
    tmp_path: Path, feast_project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_byo import config_dict, own_deployment, run_cli, write_config

    from solaris_feast.config import load_config, precompute_settings
    from solaris_feast.errors import ConfigError
    from solaris_feast.pipeline import precompute
    from solaris_feast.pipeline.commands import _interval

    monkeypatch.delenv("SOLARIS_CONFIG", raising=False)
    config = own_deployment(tmp_path, feast_project, embedding_codec="int8")
    run_cli("train", "--config", str(config))
    run_cli("precompute", "--config", str(config))
    [run_dir] = sorted((tmp_path / "runs").glob("*/*"))
    planned = pd.concat(map(pd.read_parquet, sorted(run_dir.glob("shards/*/plan/pairs.parquet"))))
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(tmp_path / "repo"))
    compressor = next(v.tags["solaris.compressor_version"] for v in store.list_feature_views())
    user = int(planned[USER_ID].iloc[0])
    items = planned.loc[planned[USER_ID] == user, ITEM_ID].astype(int).tolist()
    retriever = SolarisRetriever(store, compressor, record_misses=False, deadline_ms=5000)
    fetched = retriever.fetch(user, items)
    retriever.close()
    assert fetched.tiers.tolist() == [Tier.EXACT] * len(items)
    assert retriever.codec.name == "int8" and retriever.stats.undecodable == 0

    raw = config_dict(tmp_path, feast={"repo": "repo"})  # embedding_codec left at float32
    settings = precompute_settings(load_config(write_config(tmp_path, raw)))
    with pytest.raises(ConfigError, match="SOLARIS_EMBEDDING_CODEC=float32"):
        precompute.start_precompute(settings.model_dump(mode="json"), _interval(None, "x"))


def test_feast_apply_takes_the_codec_from_the_environment(tmp_path: Path) -> None:
    from solaris_feast.models.cards import versioned_feast_config

    assert versioned_feast_config(tmp_path, environ={}).embedding_codec == "float32"
    chosen = versioned_feast_config(tmp_path, environ={"SOLARIS_EMBEDDING_CODEC": "int8"})
    assert chosen.embedding_codec == "int8"
    with pytest.raises(ConfigError, match=r"SOLARIS_EMBEDDING_CODEC .*='int4'"):
        versioned_feast_config(tmp_path, environ={"SOLARIS_EMBEDDING_CODEC": "int4"})


def test_bench_memory_reports_bytes_per_pair_for_every_codec(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from solaris_feast.cli import app

    monkeypatch.setenv("SOLARIS_BENCH_PROJECT_PREFIX", "sp_bench_test_")
    out = tmp_path / "memory.json"
    result = CliRunner().invoke(
        app,
        ["bench", "memory", "--pairs", "100", "--ne-seeds", "", "--json", str(out)],
        env={"REDIS_URL": redis_url},
    )
    assert result.exit_code == 0, result.output
    # The console gets the figures and the path; the JSON goes to the file only.
    assert f"wrote {out}" in result.output and "bytes_per_pair.int8: " in result.output
    assert '"bytes_per_pair"' not in result.output
    report = json.loads(out.read_text())
    sizes = report["bytes_per_pair"]
    assert set(sizes) == {"float32", "float16", "int8"}
    # int8's 38-byte value keeps the hash a listpack; float32's 135 bytes do not.
    assert sizes["int8"] < sizes["float16"] <= sizes["float32"]
    assert report["per_codec"]["int8"]["hash_encoding"] == ["listpack"]
    # The stored 8-character version tag against the 35-character card version it stands for.
    assert sizes["int8"] < report["bytes_per_pair_full_version"]["int8"]
    assert "ne_cost" not in report
    client = redis.Redis.from_url(redis_url)
    assert not list(client.scan_iter(match="*sp_bench_test_*"))
