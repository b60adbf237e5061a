"""A user's history is encoded once per round and reused across that user's planned items.

Pinned against the per-pair path (``FoundationModel.representation``) on seeded data with an FM
of two transformer layers over the history: the same ``h(u, i)`` within 1e-5 for users with
long, short and no history, in any pair order, and the precompute writes the same vectors.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from solaris_feast.data.schema import InteractionDataset
from solaris_feast.data.synthetic import SyntheticConfig, generate
from solaris_feast.models.compressor import CompressorConfig
from solaris_feast.models.features import PairFeaturizer
from solaris_feast.models.foundation import FoundationConfig, FoundationModel
from solaris_feast.models.interface import ChainModels, PairsAsOf, ReferenceEncoder
from solaris_feast.models.registry import ModelBundle, register_untrained_chain
from solaris_feast.precompute.compute import CollectingSink, compute_pair_embeddings, run_precompute
from solaris_feast.precompute.plan import plan_precompute

TWO_LAYERS = FoundationConfig(
    embed_dim=16, num_heads=2, num_layers=2, hidden_dim=32, representation_dim=24
)


@pytest.fixture(scope="module")
def dataset() -> InteractionDataset:
    return generate(SyntheticConfig(num_users=40, num_items=60, num_categories=5, days=1.0))


@pytest.fixture(scope="module")
def featurizer(dataset: InteractionDataset) -> PairFeaturizer:
    return PairFeaturizer(dataset, history_len=8)


@pytest.fixture(scope="module")
def bundle(featurizer: PairFeaturizer, tmp_path_factory: pytest.TempPathFactory) -> ModelBundle:
    torch.manual_seed(1)
    return register_untrained_chain(
        tmp_path_factory.mktemp("models"),
        featurizer.schema,
        ("click", "conversion"),
        TWO_LAYERS,
        CompressorConfig(input_dim=24, code_dim=8, hidden_dim=16),
    )


def shuffled_pairs(dataset: InteractionDataset, users: int, items: int) -> tuple[np.ndarray, ...]:
    """``users`` users x ``items`` items each, interleaved in a random order."""
    rng = np.random.default_rng(4)
    user_ids = np.repeat(rng.choice(dataset.num_users, users, replace=False), items)
    item_ids = np.concatenate(
        [rng.choice(dataset.num_items, items, replace=False) for _ in range(users)]
    )
    order = rng.permutation(len(user_ids))
    return user_ids[order].astype(np.int64), item_ids[order].astype(np.int64)


def round_time(dataset: InteractionDataset) -> pd.Timestamp:
    return pd.Timestamp(dataset.interactions["event_timestamp"].max()).ceil("h")


def test_reused_history_gives_the_per_pair_representation(
    dataset: InteractionDataset, featurizer: PairFeaturizer, bundle: ModelBundle
) -> None:
    fm = bundle.fm
    assert isinstance(fm, FoundationModel) and fm.config.num_layers >= 2
    users, items = shuffled_pairs(dataset, users=12, items=7)
    # One time early in the log, so some users have no history yet and others a short one.
    for at in (round_time(dataset), pd.Timestamp(dataset.interactions["event_timestamp"].min())):
        batch = featurizer.batch(users, items, at)
        _, first, inverse = np.unique(users, return_index=True, return_inverse=True)
        fm.eval()
        with torch.inference_mode():
            per_pair = fm.representation(batch)
            history = fm.encode_history(batch.select(torch.from_numpy(first)))
            reused = fm.encode_pairs_with_history(batch, history, torch.from_numpy(inverse))
        assert len(history) == 12
        torch.testing.assert_close(reused, per_pair, rtol=0, atol=1e-5)


def test_user_index_outside_the_encoded_users_is_refused(
    dataset: InteractionDataset, featurizer: PairFeaturizer, bundle: ModelBundle
) -> None:
    users, items = shuffled_pairs(dataset, users=2, items=3)
    batch = featurizer.batch(users, items, round_time(dataset))
    with torch.inference_mode():
        history = bundle.fm.encode_history(batch.select(slice(0, 2)))
        with pytest.raises(ValueError, match=r"user_index must lie in 0\.\.1"):
            bundle.fm.encode_pairs_with_history(batch, history, torch.full((6,), 2))
        with pytest.raises(ValueError, match=r"user_index must be \(6,\)"):
            bundle.fm.encode_pairs_with_history(batch, history, torch.zeros(5, dtype=torch.long))


def test_precompute_with_reuse_writes_the_per_pair_vectors(
    dataset: InteractionDataset, featurizer: PairFeaturizer, bundle: ModelBundle
) -> None:
    users, items = shuffled_pairs(dataset, users=9, items=6)
    at = round_time(dataset)
    chain = ChainModels.reference(bundle, featurizer)
    assert isinstance(chain.encoder, ReferenceEncoder) and chain.encoder.reuse_history
    pairs = PairsAsOf.of(users, items, at, dataset)
    chain.encoder.reuse_history = False
    per_pair, _, _ = compute_pair_embeddings(chain, pairs, batch_size=16)
    chain.encoder.reuse_history = True
    reused, _, _ = compute_pair_embeddings(chain, pairs, batch_size=16)
    np.testing.assert_allclose(reused, per_pair, rtol=0, atol=1e-5)

    # run_precompute batches in user order; every pair still gets its own vector.
    candidates = pd.DataFrame(
        {"user_id": users, "item_id": items, "verifier_score": np.linspace(1, 0, len(users))}
    )
    plan = plan_precompute(candidates, None, None, len(users), at, 6 * 3600, 3600, 0.5)
    assert plan.pairs["user_id"].tolist() == users.tolist()  # interleaved users
    sink = CollectingSink()
    stats = run_precompute(plan, chain, dataset, sink, batch_size=16)
    rows = sink.rows()
    assert stats.pairs == len(users) and len(rows) == len(users)
    written = {
        (int(u), int(i)): np.asarray(z)
        for u, i, z in zip(rows["user_id"], rows["item_id"], rows["embedding"], strict=True)
    }
    for u, i, z in zip(users, items, per_pair, strict=True):
        np.testing.assert_allclose(written[(int(u), int(i))], z, rtol=0, atol=1e-5)


def test_reuse_groups_pairs_by_user_and_time(
    dataset: InteractionDataset, featurizer: PairFeaturizer, bundle: ModelBundle
) -> None:
    """The same user as of two times has two histories: each pair keeps its own."""
    users, items = shuffled_pairs(dataset, users=4, items=5)
    times = pd.Series(
        np.where(
            np.arange(len(users)) % 2 == 0,
            round_time(dataset),
            round_time(dataset) - pd.Timedelta(hours=12),
        )
    )
    chain = ChainModels.reference(bundle, featurizer)
    pairs = PairsAsOf.of(users, items, times, dataset)
    encoder = chain.encoder
    assert isinstance(encoder, ReferenceEncoder)
    reused = encoder.encode(pairs)
    encoder.reuse_history = False
    torch.testing.assert_close(reused, encoder.encode(pairs), rtol=0, atol=1e-5)
