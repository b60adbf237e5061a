"""Ids as real systems have them: sparse Int64 up to 2**63-1 and String ids (unicode, ':').

Through the writer, ``SolarisRetriever.fetch``, plain Feast ``get_online_features`` on the
resolved view, the miss queue, the user aggregate and the similarity fill, on SQLite and on the
shared Redis (this test's own Feast project; its keys are deleted by ``feast_project``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pytest

from solaris_feast.errors import WriteBatchError
from solaris_feast.keys import PairCodes, dense_pair_keys, duplicated_rows
from solaris_feast.precompute.aggregate import PairEmbeddings, aggregate_user_embeddings
from solaris_feast.precompute.similarity import (
    SimilarityConfig,
    build_user_index,
    similarity_fill,
)
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.backends import backend_for
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import (
    MODEL_VERSION_REQUEST_FIELD,
    SolarisFeastConfig,
    solaris_definitions,
)
from solaris_feast.store.layout import EntityKeyLayout
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 8
VERSION = "cmp-ids-v1"
BIG = 2**63 - 1
# Users and items of each id type; the first user holds the exact pair, the second is its
# neighbour in the similarity fill.
IDS: dict[str, tuple[list[Any], list[Any]]] = {
    "int64": ([BIG, 2**62 + 17, 3], [BIG - 1, 2**40 + 3, 5, 2**33]),
    "string": (["user:ü:1", "用户:2", "u"], ["item:a", "item:b:ß", "☃", "a:"]),
}
rng = np.random.default_rng(7)


def vectors(n: int) -> np.ndarray:
    return rng.standard_normal((n, DIM)).astype(np.float32)


def now() -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC").floor("s")


def id_series(values: list[Any]) -> pd.Series:
    if isinstance(values[0], str):
        return pd.Series(values, dtype=object)
    return pd.Series(values, dtype=np.int64)


def pair_rows(users: list[Any], items: list[Any], vecs: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": id_series(users),
            "item_id": id_series(items),
            "embedding": list(vecs),
            "model_version": VERSION,
            "computed_at": now(),
        }
    )


@pytest.fixture(params=["int64", "string"])
def id_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", "redis"])
def store(
    request: pytest.FixtureRequest, id_type: str, feast_project: str, tmp_path: Path, redis_url: str
) -> FeatureStore:
    feast_store = open_store(feast_project, tmp_path, online=request.param, redis_url=redis_url)
    config = SolarisFeastConfig(embedding_dim=DIM, user_id_type=id_type, item_id_type=id_type)
    feast_store.apply(solaris_definitions(config).all())
    return feast_store


def resolved_tiers(store: FeatureStore, user: Any, items: list[Any]) -> tuple[list[int], Any]:
    answer = store.get_online_features(
        features=["solaris_resolved:resolved_embedding", "solaris_resolved:resolved_tier"],
        entity_rows=[
            {"user_id": user, "item_id": item, MODEL_VERSION_REQUEST_FIELD: VERSION}
            for item in items
        ],
        full_feature_names=True,
    ).to_dict()
    return answer["solaris_resolved__resolved_tier"], np.asarray(
        answer["solaris_resolved__resolved_embedding"], dtype=np.float32
    )


def test_sparse_and_string_ids_through_writer_retriever_and_resolved_view(
    store: FeatureStore, id_type: str
) -> None:
    users, items = IDS[id_type]
    user = users[0]
    exact, similar, user_vec = vectors(1), vectors(1), vectors(1)
    EmbeddingWriter(store, "solaris_pair").write(pair_rows([user], [items[0]], exact))
    EmbeddingWriter(store, "solaris_similar", offline=False).write(
        pair_rows([user], [items[1]], similar).assign(neighbour_count=3, mean_distance=0.5)
    )
    EmbeddingWriter(store, "solaris_user", offline=False).write(
        pair_rows([user], [items[0]], user_vec).drop(columns="item_id").assign(pair_count=4)
    )
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    try:
        result = retriever.fetch(user, items[:3])
        # An id one character or one unit away is another key: it gets nothing.
        other = users[2]
        assert retriever.fetch(other, items[:1]).tiers.tolist() == [Tier.ZERO]
    finally:
        retriever.close()
    assert result.tiers.tolist() == [Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG]
    np.testing.assert_array_equal(result.embeddings, np.vstack([exact, similar, user_vec]))

    feast_tiers, feast_vectors = resolved_tiers(store, user, items[:3])
    assert feast_tiers == result.tiers.tolist()
    np.testing.assert_array_equal(feast_vectors, result.embeddings)
    assert resolved_tiers(store, users[2], items[:1])[0] == [Tier.ZERO]

    # The status's scan reads the stored keys back with their type.
    backend = backend_for(store, timeout_seconds=5.0)
    try:
        scan = backend.scan(SolarisFeastConfig().view_name_by_tier(), 100, 100)
    finally:
        backend.close()
    stored = {(r.tier, r.keys["user_id"], r.keys.get("item_id")) for r in scan.rows}
    assert stored == {
        (Tier.EXACT, user, items[0]),
        (Tier.SIMILAR, user, items[1]),
        (Tier.USER_AGG, user, None),
    }


def test_ids_of_the_wrong_type_are_refused_by_writer_and_retriever(
    store: FeatureStore, id_type: str
) -> None:
    users, items = IDS[id_type]
    wrong = IDS["string" if id_type == "int64" else "int64"]
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    with pytest.raises(WriteBatchError, match="user_id"):
        writer.validate(pair_rows(wrong[0][:1], items[:1], vectors(1)))
    if id_type == "string":
        with pytest.raises(WriteBatchError, match="item_id") as caught:
            writer.validate(pair_rows(users[:2], ["ok", ""], vectors(2)))
        assert caught.value.rows == [1]
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    try:
        with pytest.raises(TypeError, match="user_id"):
            retriever.fetch(wrong[0][0], items[:1])
        with pytest.raises(TypeError, match="item_ids"):
            retriever.fetch(users[0], wrong[1][:2])
        with pytest.raises(ValueError, match="duplicates"):
            retriever.fetch(users[0], [items[0], items[0]])
    finally:
        retriever.close()


def test_missed_ids_are_queued_and_drained_with_their_type(
    store: FeatureStore, id_type: str
) -> None:
    users, items = IDS[id_type]
    retriever = SolarisRetriever(store, VERSION)
    queue = MissQueue.for_store(store)
    try:
        assert retriever.fetch(users[0], items).tiers.tolist() == [Tier.ZERO] * len(items)
        retriever.fetch(users[0], items)  # the same misses again: queued once this round
        drained = queue.drain()
    finally:
        retriever.close()
        queue.close()
    queued = zip(drained["user_id"].tolist(), drained["item_id"].tolist(), strict=True)
    assert sorted(queued) == sorted((users[0], item) for item in items)
    assert all(type(v) is type(users[0]) for v in drained["user_id"].tolist())
    assert (drained["user_id"].dtype == object) == (id_type == "string")


@pytest.mark.parametrize("id_type", ["string"])  # a ':' inside an id needs String ids
def test_queued_string_ids_with_colons_do_not_collide(store: FeatureStore, id_type: str) -> None:
    queue = MissQueue.for_store(store)
    try:
        # "a:" + "b" and "a" + ":b" would both be the marker "a::b" without typed text.
        assert queue.record("a:", ["b"], VERSION) == 1
        assert queue.record("a", [":b"], VERSION) == 1
        # The string "5" and the int 5 stay apart too.
        assert queue.record("5", ["7"], VERSION) == 1
        drained = queue.drain()
    finally:
        queue.close()
    pairs = set(zip(drained["user_id"].tolist(), drained["item_id"].tolist(), strict=True))
    assert pairs == {("a:", "b"), ("a", ":b"), ("5", "7")}


def test_aggregate_and_similarity_fill_serve_sparse_and_string_ids(
    store: FeatureStore, id_type: str
) -> None:
    users, items = IDS[id_type]
    at = now()
    # User 1 holds exact pairs for items 0 and 1; user 0 is its nearest neighbour.
    held = vectors(2)
    exact_rows = pair_rows([users[1], users[1]], items[:2], held)
    exact = PairEmbeddings.from_frame(exact_rows, dim=DIM)
    aggregate = aggregate_user_embeddings(exact, at, VERSION)
    assert aggregate["user_id"].tolist() == [users[1]]
    np.testing.assert_allclose(aggregate["embedding"].iloc[0], held.mean(axis=0), rtol=1e-6)

    cfg = SimilarityConfig(neighbours=1, index_kind="flat")
    user_vecs = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0]], dtype=np.float32)
    index = build_user_index(
        np.asarray(users, dtype=object if id_type == "string" else np.int64), user_vecs, cfg
    )
    targets = pd.DataFrame({"user_id": id_series([users[0]] * 3), "item_id": id_series(items[:3])})
    filled = similarity_fill(index, targets, exact, at, VERSION, 3600, cfg)
    # Sorted by (user, item) as the ids sort; each filled pair carries its holder's vector.
    got = dict(zip(filled["item_id"].tolist(), filled["embedding"].tolist(), strict=True))
    assert filled["user_id"].tolist() == [users[0]] * 2
    assert filled["item_id"].tolist() == sorted(items[:2])
    np.testing.assert_allclose(np.vstack([got[items[0]], got[items[1]]]), held)

    EmbeddingWriter(store, "solaris_pair", offline=False).write(exact_rows)
    EmbeddingWriter(store, "solaris_user", offline=False).write(aggregate)
    EmbeddingWriter(store, "solaris_similar", offline=False).write(filled)
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    try:
        near = retriever.fetch(users[0], items[:3])
        holder = retriever.fetch(users[1], items[:3])
    finally:
        retriever.close()
    assert near.tiers.tolist() == [Tier.SIMILAR, Tier.SIMILAR, Tier.ZERO]
    assert holder.tiers.tolist() == [Tier.EXACT, Tier.EXACT, Tier.USER_AGG]
    assert resolved_tiers(store, users[0], items[:3])[0] == near.tiers.tolist()


@pytest.mark.parametrize(
    "values",
    [
        ["user:ü:1", "item:☃"],
        ["", "x"],
        ["a" * 300, "b:c"],
        [BIG, "item:a"],
        ["用户", 0],
        [BIG, BIG - 1],
    ],
)
def test_key_layout_matches_feasts_serialize_entity_key(values: list[Any]) -> None:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    layout = EntityKeyLayout(["user_id", "item_id"], 3)
    proto = EntityKeyProto(
        join_keys=["user_id", "item_id"],
        entity_values=[
            ValueProto(string_val=v) if isinstance(v, str) else ValueProto(int64_val=v)
            for v in values
        ],
    )
    key = layout.key(*values)
    assert key == serialize_entity_key(proto, entity_key_serialization_version=3)
    assert layout.decode(key) == {"user_id": values[0], "item_id": values[1]}
    # Trailing bytes (another project's suffix) or a cut key are not keys of this layout.
    assert layout.decode(key + b"x") is None
    assert layout.decode(key[:-1]) is None
    single = EntityKeyLayout(["user_id"], 3)
    assert single.decode(key) is None


def test_round_codes_keep_id_order_and_come_back() -> None:
    users = np.array(["b", "a:", "a", "é"], dtype=object)
    items = np.array(["z", "y", "x", "y"], dtype=object)
    codes = PairCodes.of([users], [items])
    keys = codes.keys(users, items)
    back_users, back_items = codes.split(keys)
    assert back_users.tolist() == users.tolist() and back_items.tolist() == items.tolist()
    # Sorting by key sorts by (user, item) as the ids themselves sort.
    assert [users[i] for i in np.argsort(keys)] == sorted(users.tolist())
    sparse = np.array([BIG, 0, 2**40], dtype=np.int64)
    assert np.argsort(dense_pair_keys(sparse, sparse)).tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match="no code"):
        codes.keys(np.array(["nobody"], dtype=object), np.array(["z"], dtype=object))


def _monotone(id_type: str, dense: np.ndarray, *, item: bool) -> np.ndarray:
    """Dense ids 0..N-1 mapped, order kept, to sparse int64 or to strings with ':' and unicode."""
    if id_type == "int64":
        # Spread over the whole int64 range; the largest is 2**63-1 itself.
        return (BIG - (2**50) * (1_000 - dense.astype(np.int64))).astype(np.int64)
    prefix = "itém:" if item else "usér:"
    return np.array([f"{prefix}{v:06d}" for v in dense.tolist()], dtype=object)


@pytest.mark.parametrize("id_type", ["int64", "string"])
def test_candidates_and_plan_give_the_same_pairs_for_any_id_spelling(id_type: str) -> None:
    from solaris_feast.precompute.candidates import CandidateConfig, generate_candidates
    from solaris_feast.precompute.plan import plan_precompute

    at = pd.Timestamp("2026-06-01T12:00:00Z")
    gen = np.random.default_rng(3)
    n = 4000
    log = pd.DataFrame(
        {
            "user_id": gen.integers(0, 150, n).astype(np.int64),
            "item_id": (gen.zipf(1.4, n) % 300).astype(np.int64),
            "event_timestamp": at - pd.to_timedelta(gen.uniform(0.01, 24 * 10, n), unit="h"),
        }
    )
    items = pd.DataFrame({"item_id": np.arange(300, dtype=np.int64), "genre": np.arange(300) % 7})
    cfg = CandidateConfig(candidates_per_user=20, category_column="genre")
    dense = generate_candidates(log, at, cfg, items=items)

    def spell(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.assign(user_id=_monotone(id_type, frame["user_id"].to_numpy(), item=False))
        return out.assign(item_id=_monotone(id_type, frame["item_id"].to_numpy(), item=True))

    spelled = generate_candidates(spell(log), at, cfg, items=spell(items.assign(user_id=0)))
    pd.testing.assert_frame_equal(spelled, spell(dense), check_dtype=False)
    assert spelled["user_id"].dtype == (object if id_type == "string" else np.int64)

    scored = dense.assign(verifier_score=gen.uniform(0, 1, len(dense)))
    misses = scored.iloc[:7][["user_id", "item_id"]].assign(verifier_score=0.9)
    state = scored.iloc[7:40][["user_id", "item_id"]].assign(computed_at=at, model_version="v")
    args = dict(budget_pairs=200, now=at, ttl_seconds=3600, refresh_margin_seconds=600)
    plain = plan_precompute(scored, misses, state, min_miss_score=0.0, model_version="v", **args)
    coded = plan_precompute(
        spell(scored), spell(misses), spell(state), min_miss_score=0.0, model_version="v", **args
    )
    pd.testing.assert_frame_equal(coded.pairs, spell(plain.pairs), check_dtype=False)
    assert coded.stats == plain.stats and plain.stats.skipped_fresh == 33


# --- The reference models' id vocabulary ----------------------------------------------------------


def _sparse_log(n: int, seed: int, users: int = 40, items: int = 30) -> pd.DataFrame:
    """A log with sparse int64 user ids near 2**63-1 and String item ids, its own label."""
    gen = np.random.default_rng(seed)
    user = gen.integers(0, users, n)
    item = gen.integers(0, items, n)
    return pd.DataFrame(
        {
            "user_id": (BIG - user.astype(np.int64) * 2**40).astype(np.int64),
            "item_id": np.array([f"sku:{i}:ü" for i in item.tolist()], dtype=object),
            "event_timestamp": pd.Timestamp("2026-06-01T00:00:00Z")
            + pd.to_timedelta(np.sort(gen.uniform(0, 72, n)), unit="h"),
            "clicked": (item % 3 == 0).astype(np.int64),  # a property of the item
        }
    )


def test_vocabulary_maps_known_ids_to_rows_and_unknown_ids_to_the_oov_bucket() -> None:
    from solaris_feast.models.vocabulary import OOV_INDEX, Vocabulary

    log = pd.DataFrame(
        {"user_id": np.array([BIG, 5, BIG, 2**40]), "item_id": ["b:1", "a", "☃", "a"]}
    )
    vocab = Vocabulary.from_log(log)
    assert vocab.users.size == 4 and vocab.items.size == 4  # three known ids plus OOV
    assert vocab.users.index(np.array([5, 2**40, BIG, 6])).tolist() == [1, 2, 3, OOV_INDEX]
    assert vocab.items.index(np.array(["a", "b:1", "☃", "b"], dtype=object)).tolist() == [
        1,
        2,
        3,
        OOV_INDEX,
    ]
    # An id of the other type is unknown, not an error.
    assert vocab.items.index(np.array([1], dtype=np.int64)).tolist() == [OOV_INDEX]
    # Ids seen fewer than min_count times are left to the OOV bucket.
    assert Vocabulary.from_log(log, min_count=2).users.ids.tolist() == [BIG]


def test_vocabulary_save_load_round_trip_beside_the_card(tmp_path: Path) -> None:
    from solaris_feast.errors import ConfigError
    from solaris_feast.models.vocabulary import Vocabulary, vocabulary_path

    vocab = Vocabulary.from_log(_sparse_log(200, seed=1))
    path = vocab.save(tmp_path, "fm-ids-1")
    assert path == vocabulary_path(tmp_path, "fm-ids-1") and path.parent == tmp_path
    loaded = Vocabulary.load(tmp_path, "fm-ids-1")
    assert loaded is not None
    assert (
        loaded.users.ids.dtype == np.int64 and loaded.users.ids.tolist() == vocab.users.ids.tolist()
    )
    assert BIG in loaded.users.ids.tolist()
    assert loaded.items.ids.tolist() == vocab.items.ids.tolist()
    assert Vocabulary.load(tmp_path, "fm-without-vocabulary") is None
    path.rename(vocabulary_path(tmp_path, "fm-other"))
    with pytest.raises(ConfigError, match="fm-ids-1"):
        Vocabulary.load(tmp_path, "fm-other")


def test_reference_vm_trained_with_a_vocabulary_scores_a_log_with_sparse_ids(
    tmp_path: Path,
) -> None:
    import torch

    from solaris_feast.models.registry import load_bundle, register_untrained_chain
    from solaris_feast.models.training import TrainConfig, train_vertical, vertical_probabilities
    from solaris_feast.models.vertical import VerticalConfig, VerticalModel
    from solaris_feast.models.vocabulary import OOV_INDEX, Vocabulary, VocabularyFeaturizer

    train = _sparse_log(1500, seed=2)
    vocab = Vocabulary.from_log(train)
    featurizer = VocabularyFeaturizer(vocab, train, ("clicked",), history_len=8)
    schema = featurizer.schema
    assert (schema.num_users, schema.num_items) == (vocab.users.size, vocab.items.size)
    torch.manual_seed(0)
    vm = VerticalModel(schema, 1, VerticalConfig(embedding_dim=0))
    batch = featurizer.for_log(train)
    labels = torch.from_numpy(train[["clicked"]].to_numpy(np.float32))
    train_vertical(vm, batch, labels, TrainConfig(epochs=15, batch_size=128, learning_rate=1e-2))
    trained = vertical_probabilities(vm, batch)[:, 0].numpy()
    # It learned something from the sparse ids: clicked pairs score higher.
    clicked = train["clicked"].to_numpy() == 1
    assert trained[clicked].mean() > trained[~clicked].mean() + 0.1

    # A later log: known ids, users and items never seen (ids of a later signup), one per type.
    later = _sparse_log(300, seed=3, users=60, items=45)
    later["event_timestamp"] += pd.Timedelta(days=5)
    scorer = VocabularyFeaturizer(vocab, pd.concat([train, later]), ("clicked",), history_len=8)
    scoring = scorer.for_log(later)
    unknown_user = ~np.isin(later["user_id"], train["user_id"])
    assert unknown_user.any()
    assert (scoring.user_id.numpy()[unknown_user] == OOV_INDEX).all()
    assert (scoring.user_id.numpy()[~unknown_user] > OOV_INDEX).all()
    # Two unknown users embed alike (OOV) but keep their own histories.
    new_users = later.loc[unknown_user, "user_id"].unique()[:2]
    rows = [int(np.flatnonzero(later["user_id"].to_numpy() == u)[-1]) for u in new_users]
    assert not torch.equal(scoring.hist_item[rows[0]], scoring.hist_item[rows[1]])
    probabilities = vertical_probabilities(vm, scoring)[:, 0].numpy()
    assert np.isfinite(probabilities).all() and ((probabilities >= 0) & (probabilities <= 1)).all()

    # Saved beside the FM card, the vocabulary comes back with the bundle.
    torch.manual_seed(0)
    chain = register_untrained_chain(tmp_path, schema, ("clicked", "liked"))
    vocab.save(tmp_path, chain.fm_card.version)
    bundle = load_bundle(tmp_path)
    assert bundle.vocabulary is not None
    assert bundle.vocabulary.users.ids.tolist() == vocab.users.ids.tolist()


def test_featurizer_for_a_bundle_maps_ids_through_its_vocabulary() -> None:
    from solaris_feast.data.synthetic import SyntheticConfig, generate
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.vocabulary import OOV_INDEX, Vocabulary, featurizer_for

    dataset = generate(SyntheticConfig(num_users=50, num_items=40, days=1.0))
    assert isinstance(featurizer_for(None, dataset, 4), PairFeaturizer)
    log = dataset.interactions
    # A vocabulary that knows only the first half of the users (a model trained earlier).
    early = log.loc[log["user_id"] < 25]
    vocab = Vocabulary.from_log(early)
    featurizer = featurizer_for(vocab, dataset, 4)
    plain = PairFeaturizer(dataset, 4).for_log(log)
    mapped = featurizer.for_log(log)
    assert mapped.user_id.tolist() == vocab.users.index(log["user_id"]).tolist()
    assert (mapped.user_id.numpy()[log["user_id"].to_numpy() >= 25] == OOV_INDEX).all()
    # Histories and attributes are the log's own; only the rows the models see are mapped.
    assert mapped.hist_mask.tolist() == plain.hist_mask.tolist()
    assert mapped.user_cat.tolist() == plain.user_cat.tolist()
    assert (
        mapped.hist_item.tolist()
        == np.where(
            plain.hist_mask.numpy(),
            vocab.items.index(plain.hist_item.numpy().ravel()).reshape(plain.hist_item.shape),
            0,
        ).tolist()
    )


@pytest.mark.parametrize(
    ("values", "id_type", "error"),
    [
        (["a", 1], "string", TypeError),  # numpy alone would make "1" of the 1
        ([1, "a"], "int64", TypeError),
        ([True], "int64", TypeError),
        ([2**63], "int64", ValueError),
        ([-1], "int64", ValueError),
        (["ok", ""], "string", ValueError),
        ([b"bytes"], "string", TypeError),
    ],
)
def test_bad_ids_are_refused_naming_the_column(
    values: list[Any], id_type: str, error: type
) -> None:
    from solaris_feast.store.ids import check_ids

    with pytest.raises(error, match="item_ids"):
        check_ids(values, id_type, "item_ids")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["int64", "two_int64", "string", "mixed"])
def test_duplicated_rows_marks_what_pandas_marks(kind: str) -> None:
    rng = np.random.default_rng(7)
    n = 400
    users = rng.integers(0, 500, n)  # some repeat, most do not
    items = rng.integers(0, 2, n)
    columns: list[np.ndarray] = {
        "int64": [users],
        "two_int64": [users, items],
        "string": [np.array([f"u{u}" for u in users], dtype=object)],
        "mixed": [np.array([f"u{u}" for u in users], dtype=object), items],
    }[kind]
    expected = pd.DataFrame(dict(enumerate(columns))).duplicated(keep=False).to_numpy()
    assert expected.any() and not expected.all()
    assert duplicated_rows(columns).tolist() == expected.tolist()
    assert duplicated_rows([c[:1] for c in columns]).tolist() == [False]
    assert duplicated_rows([c[:0] for c in columns]).tolist() == []
