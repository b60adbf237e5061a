"""The two results the method stands on, on the tiny synthetic preset with fixed seeds.

- Embedding transfer: the VM given the FM's compressed embedding ``z`` predicts better (lower
  NE) than the VM alone (the transfer evaluation).
- Speculative precompute: under the same FM budget, planning by the verifier (the VM's score
  times the retrieval score) precomputes more of the pairs that are then requested than
  planning at random (the replay's exact hit rate).

Both train real models, so each is kept to one seed, one coverage or budget, and few steps.
Checked by sabotage when written: feeding the VM zeros for ``z`` at test time in
``evaluation/transfer.py``, or scoring the replay's verifier planner with the random planner's
scores, makes the matching test fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from solaris_feast.data.datasets import load_dataset
from solaris_feast.data.schema import time_split
from solaris_feast.evaluation.replay import SimulationConfig, simulate
from solaris_feast.evaluation.transfer import TransferConfig, evaluate_transfer
from solaris_feast.models.chain import TrainingConfig, train_and_register
from solaris_feast.models.training import TrainConfig

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SEED = 0
FAST_MODELS = TransferConfig(
    history_len=8,
    fm_training=TrainConfig(epochs=1, batch_size=256, learning_rate=2e-3),
    compressor_training=TrainConfig(epochs=1, batch_size=512, learning_rate=1e-3),
    vm_training=TrainConfig(epochs=1, batch_size=256, learning_rate=3e-3),
    coverages=(1.0,),
)
"""The transfer evaluation's models with a short history and one epoch each."""


def test_vm_with_the_fm_embedding_has_lower_ne_than_the_vm_alone() -> None:
    ds = load_dataset("synthetic", "tiny", SEED)
    record: dict[str, Any] = evaluate_transfer(ds, seeds=[SEED], config=FAST_MODELS).to_json()
    ne = record["ne"]
    main_task = record["tasks"][0]
    # The FM must beat the VM for there to be a gain to transfer at all.
    assert ne["fm"][main_task] < ne["vm"][main_task]
    # And z carries a real share of that gain to the VM, not noise around zero.
    gain = ne["vm"][main_task] - ne["vm_solaris"][main_task]
    assert gain > 0.2 * (ne["vm"][main_task] - ne["fm"][main_task]), ne


def test_verifier_planner_precomputes_more_requested_pairs_than_random(tmp_path: Path) -> None:
    config = SimulationConfig(
        dataset="synthetic",
        size="tiny",
        seed=SEED,
        planners=("verifier", "random"),
        budgets=(0.05,),
        # The exact hit rate does not depend on the fill; the aggregate space spares the FM a
        # pass over every user each step.
        similarity_space="aggregate",
        compare_similarity_spaces=False,
        feast_check=False,
        ne_vm="registered",
        warmup_steps=4,
        max_steps=6,
    )
    ds = load_dataset(config.dataset, config.size, config.seed)
    train_ds, _ = time_split(ds, config.train_fraction)
    # Trained as the replay trains its own, with a short history and one epoch each, to be fast.
    bundle = train_and_register(train_ds, tmp_path, TrainingConfig(seed=SEED, models=FAST_MODELS))
    records = {r["planner"]: r for r in simulate(config, dataset=ds, bundle=bundle)}
    verifier, random = records["verifier"], records["random"]
    assert verifier["fm_pairs"] == pytest.approx(random["fm_pairs"], rel=0.05)  # same budget
    assert verifier["exact_hit_rate"] > 1.5 * random["exact_hit_rate"], (
        verifier["exact_hit_rate"],
        random["exact_hit_rate"],
    )
