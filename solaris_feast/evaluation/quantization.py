"""What storing ``z`` quantized costs the VM: its NE with dequantized ``z`` against float32 ``z``.

For each seed, on a time split of one data set, this trains the FM (on the earliest part of the
training span), the compressor and a VM that takes ``z`` on every pair, as the transfer
evaluation does (:mod:`solaris_feast.evaluation.transfer`). The VM is trained on float32 ``z``
(the offline log keeps float32), then scored on the held-out period twice per codec: with the
float32 ``z`` and with ``z`` after an encode/decode round trip through the codec
(:func:`solaris_feast.store.layout.embedding_codec`), which is exactly what serving reads back.
The cost is the difference of the NEs on the same rows, so the training noise of the models
cancels out; a positive cost is a loss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from solaris_feast.data.schema import InteractionDataset, earliest_rows, time_split
from solaris_feast.evaluation.metrics import normalized_entropy
from solaris_feast.models.compressor import PCA, CompressorConfig, EmbeddingCompressor
from solaris_feast.models.features import PairFeaturizer, labels_of
from solaris_feast.models.foundation import FoundationConfig, FoundationModel
from solaris_feast.models.training import (
    TrainConfig,
    encode,
    foundation_outputs,
    seed_everything,
    train_compressor,
    train_foundation,
    train_vertical,
    vertical_probabilities,
)
from solaris_feast.models.vertical import VerticalConfig, VerticalModel
from solaris_feast.store.layout import embedding_codec
from solaris_feast.tiers import Tier

QUANTIZED_CODECS = ("float16", "int8")


def round_trip(z: np.ndarray, codec: str) -> np.ndarray:
    """``(N, d)`` float32 as serving reads it back after storing ``z`` with ``codec``."""
    coder = embedding_codec(codec, z.shape[1])
    return np.asarray(coder.decode_packed(coder.encode_rows(z)), dtype=np.float32)


def quantization_ne_cost(
    dataset: InteractionDataset,
    seeds: Sequence[int],
    codecs: Sequence[str] = QUANTIZED_CODECS,
    *,
    code_dim: int = 32,
    history_len: int = 32,
    fm_epochs: int = 3,
    vm_epochs: int = 2,
) -> dict[str, Any]:
    """NE of the VM on held-out rows with float32 ``z`` and with each codec's round trip.

    Returns ``{"per_seed": [...], "ne_cost": {codec: {task: mean}}, "ne_cost_max": {codec:
    worst task and seed}}``; costs are ``NE(dequantized) - NE(float32)``.
    """
    train, test = time_split(dataset, 0.8)
    featurizer = PairFeaturizer(dataset, history_len)
    tasks = dataset.label_columns
    train_batch, test_batch = (
        featurizer.for_log(train.interactions),
        featurizer.for_log(test.interactions),
    )
    y_train, y_test = labels_of(train.interactions, tasks), labels_of(test.interactions, tasks)
    fm_rows = earliest_rows(train.interactions, 0.75)
    fm_index = torch.from_numpy(np.flatnonzero(fm_rows))
    # z on the rows the FM did not train on only, as in the transfer evaluation.
    tier_train = torch.from_numpy(np.where(~fm_rows, int(Tier.EXACT), int(Tier.ZERO)))
    tier_test = torch.full((len(test_batch),), int(Tier.EXACT))
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        started = time.perf_counter()
        seed_everything(seed)
        fm = FoundationModel(featurizer.schema, len(tasks), FoundationConfig())
        train_foundation(
            fm,
            train_batch.select(fm_index),
            y_train[fm_index],
            TrainConfig(epochs=fm_epochs, batch_size=256, learning_rate=2e-3, seed=seed),
        )
        h_train, _ = foundation_outputs(fm, train_batch)
        h_test, _ = foundation_outputs(fm, test_batch)
        pca = PCA(h_train[fm_index], code_dim)
        seed_everything(seed)
        compressor = EmbeddingCompressor(
            CompressorConfig(input_dim=h_train.shape[1], code_dim=code_dim)
        )
        compressor.init_from_pca(pca)
        train_compressor(
            compressor,
            h_train[fm_index],
            TrainConfig(epochs=2, batch_size=512, learning_rate=1e-3, seed=seed),
        )
        z_train, z_test = encode(compressor, h_train), encode(compressor, h_test)
        seed_everything(seed)
        vm = VerticalModel(featurizer.schema, len(tasks), VerticalConfig(embedding_dim=code_dim))
        train_vertical(
            vm,
            train_batch,
            y_train,
            TrainConfig(epochs=vm_epochs, batch_size=256, learning_rate=3e-3, seed=seed),
            z=z_train,
            tier=tier_train,
        )
        probabilities = vertical_probabilities(vm, test_batch, z_test, tier_test)
        exact = normalized_entropy(probabilities, y_test)
        row: dict[str, Any] = {"seed": seed, "ne_float32": dict(zip(tasks, exact, strict=True))}
        for codec in codecs:
            served = torch.from_numpy(round_trip(z_test.numpy(), codec))
            probabilities = vertical_probabilities(vm, test_batch, served, tier_test)
            ne = normalized_entropy(probabilities, y_test)
            row[f"ne_{codec}"] = dict(zip(tasks, ne, strict=True))
            row[f"cost_{codec}"] = {
                task: float(q - f) for task, q, f in zip(tasks, ne, exact, strict=True)
            }
            row[f"max_abs_error_{codec}"] = float((served - z_test).abs().max())
        row["seconds"] = round(time.perf_counter() - started, 1)
        per_seed.append(row)
    costs = {
        codec: {
            task: float(np.mean([r[f"cost_{codec}"][task] for r in per_seed])) for task in tasks
        }
        for codec in codecs
    }
    worst = {
        codec: float(max(r[f"cost_{codec}"][task] for r in per_seed for task in tasks))
        for codec in codecs
    }
    return {
        "tasks": list(tasks),
        "test_rows": len(test_batch),
        "per_seed": per_seed,
        "ne_cost": costs,
        "ne_cost_max": worst,
    }
