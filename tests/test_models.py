"""Reference models: shapes, training lowers the loss, the compressor beats PCA, artifacts are
trusted only when their sha256 matches the card."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from solaris_feast.data.schema import InteractionDataset
from solaris_feast.data.synthetic import SyntheticConfig, generate
from solaris_feast.errors import ArtifactIntegrityError
from solaris_feast.models.compressor import PCA, EmbeddingCompressor
from solaris_feast.models.features import PairFeaturizer, labels_of
from solaris_feast.models.foundation import FoundationModel
from solaris_feast.models.registry import load_bundle, read_card, save_model
from solaris_feast.models.training import (
    TrainConfig,
    flops_per_pair,
    foundation_outputs,
    normalized_entropy,
    train_compressor,
    train_foundation,
    train_vertical,
    transfer_ratio,
)
from solaris_feast.models.vertical import FM_SPAN_TIER, VerticalModel, fm_span_tiers
from solaris_feast.tiers import Tier


@pytest.fixture(scope="module")
def dataset() -> InteractionDataset:
    return generate(SyntheticConfig(num_users=120, num_items=80, num_categories=6, days=2.0))


def test_forward_shapes(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=16)
    b = f.for_log(dataset.interactions.iloc[:10])
    fm = FoundationModel(f.schema, 2)
    assert fm(b).shape == (10, 2)
    assert fm.representation(b).shape == (10, 128)
    assert fm.user_representation(b).shape == (10, 128)
    vm = VerticalModel(f.schema, 2)
    z = torch.randn(10, 32)
    tier = torch.full((10,), int(Tier.EXACT))
    assert vm(b, z, tier).shape == (10, 2)
    assert vm.verifier_score(b).shape == (10,)
    comp = EmbeddingCompressor()
    assert comp.encode(torch.randn(10, 128)).shape == (10, 32)


def test_vm_ignores_the_vector_when_the_tier_is_zero(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=8)
    b = f.for_log(dataset.interactions.iloc[:6])
    vm = VerticalModel(f.schema, 2)
    zero = torch.full((6,), int(Tier.ZERO))
    assert torch.equal(vm(b, torch.randn(6, 32), zero), vm(b, torch.zeros(6, 32), zero))


def test_vm_rejects_a_wrong_dimension(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=8)
    b = f.for_log(dataset.interactions.iloc[:4])
    with pytest.raises(ValueError, match=r"z must be \(4, 32\)"):
        VerticalModel(f.schema, 2)(b, torch.zeros(4, 16), torch.zeros(4, dtype=torch.long))


def test_vm_costs_at_most_a_tenth_of_the_fm(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset)
    b = f.for_log(dataset.interactions.iloc[:32])
    fm, vm = FoundationModel(f.schema, 2), VerticalModel(f.schema, 2)
    z, tier = torch.zeros(32, 32), torch.full((32,), int(Tier.EXACT))
    fm_flops = flops_per_pair(fm, lambda: fm(b), 32)
    vm_flops = flops_per_pair(vm, lambda: vm(b, z, tier), 32)
    assert vm_flops > 0 and vm_flops <= 0.1 * fm_flops


def test_short_training_lowers_the_loss(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=16)
    b = f.for_log(dataset.interactions)
    y = labels_of(dataset.interactions, dataset.label_columns)
    fm = FoundationModel(f.schema, 2)
    losses = train_foundation(fm, b, y, TrainConfig(epochs=3, batch_size=256, learning_rate=3e-3))
    assert losses[-1] < losses[0]
    vm = VerticalModel(f.schema, 2)
    vm_losses = train_vertical(vm, b, y, TrainConfig(epochs=3, batch_size=256, learning_rate=3e-3))
    assert vm_losses[-1] < vm_losses[0]


def test_training_is_deterministic_by_seed(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=8)
    b = f.for_log(dataset.interactions.iloc[:600])
    y = labels_of(dataset.interactions.iloc[:600], dataset.label_columns)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        vm = VerticalModel(f.schema, 2)
        runs.append(train_vertical(vm, b, y, TrainConfig(epochs=1, batch_size=128, seed=3)))
    assert runs[0] == runs[1]


def test_compressor_is_no_worse_than_pca_on_fm_representations(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=16)
    log = dataset.interactions
    b = f.for_log(log)
    y = labels_of(log, dataset.label_columns)
    torch.manual_seed(0)
    fm = FoundationModel(f.schema, 2)
    train_foundation(fm, b, y, TrainConfig(epochs=1, batch_size=256))
    h, _ = foundation_outputs(fm, b)
    cut = int(0.8 * len(h))
    fit, held_out = h[:cut], h[cut:]
    pca = PCA(fit, 32)
    # Brute-force reference: PCA reconstruction computed by hand from an SVD.
    centred = fit.double() - fit.double().mean(0)
    _, _, vt = torch.linalg.svd(centred, full_matrices=False)
    basis = vt[:32]
    manual = (held_out.double() - fit.double().mean(0)) @ basis.T @ basis + fit.double().mean(0)
    manual_mse = float(((manual - held_out.double()) ** 2).mean())
    assert pca.reconstruction_mse(held_out) == pytest.approx(manual_mse, rel=1e-4)
    comp = EmbeddingCompressor()
    comp.init_from_pca(pca)
    train_compressor(comp, fit, TrainConfig(epochs=3, batch_size=256, learning_rate=1e-3))
    with torch.inference_mode():
        ae_mse = float(((comp(held_out) - held_out) ** 2).mean())
    assert ae_mse <= manual_mse * 1.02


def test_ne_and_transfer_ratio_on_hand_checked_numbers() -> None:
    # Base rate 0.5 -> entropy ln 2; predicting 0.5 everywhere gives NE exactly 1.
    labels = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    assert normalized_entropy(torch.full((4, 1), 0.5), labels)[0] == pytest.approx(1.0)
    better = torch.tensor([[0.9], [0.1], [0.9], [0.1]])
    expected = -torch.log(torch.tensor(0.9)).item() / torch.log(torch.tensor(2.0)).item()
    assert normalized_entropy(better, labels)[0] == pytest.approx(expected, rel=1e-6)
    # NE_vm 0.90, NE_fm 0.80, NE_x 0.85: half of the FM's gain transferred.
    assert transfer_ratio(0.90, 0.85, 0.80) == pytest.approx(0.5)
    assert transfer_ratio(0.90, 0.90, 0.80) == pytest.approx(0.0)
    assert transfer_ratio(0.80, 0.80, 0.90) != transfer_ratio(0.80, 0.80, 0.90)  # NaN: no gain


def test_registry_round_trip_and_tampered_weights_are_refused(
    dataset: InteractionDataset, tmp_path: Path
) -> None:
    f = PairFeaturizer(dataset, history_len=8)
    fm = FoundationModel(f.schema, 2)
    fm_card = save_model(
        fm,
        "fm",
        tmp_path,
        config={"model": fm.config.model_dump(), "schema": f.schema.to_dict()},
        tasks=("click", "conversion"),
    )
    comp = EmbeddingCompressor()
    comp_card = save_model(
        comp,
        "compressor",
        tmp_path,
        parents=(fm_card.version,),
        config={"model": comp.config.model_dump()},
    )
    vm = VerticalModel(f.schema, 2)
    vm_card = save_model(
        vm,
        "vm",
        tmp_path,
        parents=(comp_card.version,),
        config={"model": vm.config.model_dump(), "schema": f.schema.to_dict()},
        tasks=("click", "conversion"),
    )
    bundle = load_bundle(tmp_path)
    assert bundle.vm_card.version == vm_card.version
    assert bundle.embedding_version == comp_card.version
    assert (
        read_card(tmp_path / f"{fm_card.version}.card.json").weights_sha256
        == fm_card.weights_sha256
    )
    b = f.for_log(dataset.interactions.iloc[:5])
    with torch.inference_mode():
        assert torch.equal(bundle.fm(b), fm.eval()(b))
    weights = tmp_path / comp_card.weights_file
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(ArtifactIntegrityError, match="sha256"):
        load_bundle(tmp_path)


def test_each_enrichment_tier_learns_its_own_reading_of_z(dataset: InteractionDataset) -> None:
    """Exact-only training leaves the enrichment readings at zero (the exact path is the plain
    z slot); training on a tier mix moves them, and a tier's reading acts on its rows only."""
    f = PairFeaturizer(dataset, history_len=8)
    b = f.for_log(dataset.interactions.iloc[:512])
    y = labels_of(dataset.interactions.iloc[:512], dataset.label_columns)
    z = torch.randn(512, 32)
    exact_or_zero = torch.where(torch.arange(512) % 2 == 0, int(Tier.EXACT), int(Tier.ZERO)).long()
    cfg = TrainConfig(epochs=1, batch_size=128, seed=0)
    torch.manual_seed(0)
    vm = VerticalModel(f.schema, 2)
    train_vertical(vm, b, y, cfg, z=z, tier=exact_or_zero)
    assert all(not r.any() for r in vm.tier_readings.values())

    mixed = torch.arange(512) % 4  # every tier
    train_vertical(vm, b, y, cfg, z=z, tier=mixed)
    assert all(r.abs().sum() > 0 for r in vm.tier_readings.values())
    user = torch.full((8,), int(Tier.USER_AGG))
    exact = torch.full((8,), int(Tier.EXACT))
    head = b.select(slice(0, 8))
    with torch.no_grad():
        before = vm(head, z[:8], exact), vm(head, z[:8], user)
        vm.tier_readings["user_agg"].add_(1.0)
        after = vm(head, z[:8], exact), vm(head, z[:8], user)
    assert torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])


def test_untrained_chain_registers_matching_widths_and_refuses_a_mismatch(
    dataset: InteractionDataset, tmp_path: Path
) -> None:
    from solaris_feast.errors import ConfigError
    from solaris_feast.models.compressor import CompressorConfig
    from solaris_feast.models.foundation import FoundationConfig
    from solaris_feast.models.registry import register_untrained_chain

    schema = PairFeaturizer(dataset, history_len=8).schema
    fm_cfg = FoundationConfig(embed_dim=16, num_heads=2, hidden_dim=32, representation_dim=24)
    bundle = register_untrained_chain(
        tmp_path / "ok",
        schema,
        ("click", "conversion"),
        fm_cfg,
        CompressorConfig(input_dim=24, code_dim=8),
    )
    assert bundle.vm.config.embedding_dim == bundle.compressor.config.code_dim
    assert bundle.vm_card.parents == (bundle.compressor_card.version,)
    assert bundle.compressor_card.parents == (bundle.fm_card.version,)
    with pytest.raises(ConfigError, match="input_dim 128 != FM representation_dim 24"):
        register_untrained_chain(tmp_path / "bad", schema, ("click",), fm_cfg, CompressorConfig())


def test_bundle_and_serving_version_follow_the_promoted_chain_not_the_newest(
    dataset: InteractionDataset, tmp_path: Path
) -> None:
    """A training run registers a chain before anyone promotes it; until then the store holds
    the promoted compressor's vectors, so serving code must ask for that version (a newest-VM
    rule served every request ZERO, each vector rejected as another version)."""
    from solaris_feast.models.cards import serving_embedding_version
    from solaris_feast.models.registry import register_untrained_chain
    from solaris_feast.pipeline.promotion import promote

    schema = PairFeaturizer(dataset, history_len=8).schema
    promoted = register_untrained_chain(tmp_path, schema, ("click", "conversion"))
    promote(tmp_path, promoted.vm_card.version)
    # Registered later and never promoted: what the daily training DAG leaves behind.
    newer = register_untrained_chain(tmp_path, schema, ("click", "conversion"))
    assert newer.embedding_version != promoted.embedding_version

    assert load_bundle(tmp_path).vm_card.version == promoted.vm_card.version
    assert serving_embedding_version(tmp_path) == promoted.embedding_version
    assert load_bundle(tmp_path, newer.vm_card.version).embedding_version == newer.embedding_version
    promote(tmp_path, newer.vm_card.version)
    assert load_bundle(tmp_path).vm_card.version == newer.vm_card.version
    assert serving_embedding_version(tmp_path) == newer.embedding_version


def test_devices_resolve_and_a_device_this_process_cannot_see_is_refused() -> None:
    from solaris_feast.errors import ConfigError
    from solaris_feast.models.training import resolve_device

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="not a torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no such CUDA device"):
            resolve_device("cuda:0")


def test_bf16_autocast_trains_and_encodes_close_to_fp32_and_hands_models_back_on_the_cpu(
    dataset: InteractionDataset,
) -> None:
    """The GPU path's code (device moves, bf16 autocast) run on the CPU, which torch also
    autocasts: the loss falls as in fp32, the model comes back on the CPU, and bf16
    representations stay within bf16's resolution of fp32's."""
    from solaris_feast.models.interface import PairsAsOf, ReferenceEncoder

    f = PairFeaturizer(dataset, history_len=8)
    rows = dataset.interactions.iloc[:512]
    batch, labels = f.for_log(rows), labels_of(rows, dataset.label_columns)
    losses = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        fm = FoundationModel(f.schema, 2)
        cfg = TrainConfig(epochs=3, batch_size=128, device="auto", precision=precision)
        losses[precision] = train_foundation(fm, batch, labels, cfg)
        assert next(fm.parameters()).device.type == "cpu"
        assert next(fm.parameters()).dtype == torch.float32  # autocast leaves weights fp32
    assert losses["bf16"][-1] < losses["bf16"][0]
    assert abs(losses["bf16"][-1] - losses["fp32"][-1]) < 0.05
    pairs = PairsAsOf.of_rows(rows.iloc[:64], dataset)
    exact = ReferenceEncoder(fm, featurizer=f).encode(pairs)
    fast = ReferenceEncoder(fm, featurizer=f, device="auto", precision="bf16").encode(pairs)
    assert fast.dtype == torch.float32 and fast.device.type == "cpu"
    assert float((fast - exact).abs().max()) < 0.1
    assert not torch.equal(fast, exact)  # bf16 really ran


def test_rows_the_fm_trained_on_teach_their_own_tier_not_zero(dataset: InteractionDataset) -> None:
    """The FM's training rows carry no ``z`` the VM may see. Trained as tier ZERO, they teach
    ZERO *their* click rate (the earliest rows of the log, ranked by an older policy); with the
    training-only FM-span tier, ZERO keeps the rate of the rows it is served on. Here the two
    groups differ only in their labels (5 % against 40 %, rows assigned at random, so no input
    tells them apart) and in the tier they are given."""
    n = 2048
    f = PairFeaturizer(dataset, history_len=8)
    b = f.for_log(dataset.interactions.iloc[:n])
    gen = torch.Generator().manual_seed(0)
    fm_rows = (torch.rand(n, generator=gen) < 0.75).numpy()
    later = torch.from_numpy(~fm_rows)
    rate = torch.where(later, 0.4, 0.05)
    y = (torch.rand(n, 2, generator=gen) < rate.unsqueeze(-1)).float()
    z = torch.randn(n, 32, generator=gen)
    draw = torch.rand(n, generator=gen)
    tier = torch.where(draw < 0.5, int(Tier.EXACT), int(Tier.ZERO)).long()
    tier[~later] = int(Tier.ZERO)
    cfg = TrainConfig(epochs=10, batch_size=128, learning_rate=3e-3, seed=0)
    zero_later = later & (tier == int(Tier.ZERO))
    served_zero = torch.full((int(zero_later.sum()),), int(Tier.ZERO))
    predicted = {}
    for name, tiers in (("as ZERO", tier), ("own tier", fm_span_tiers(tier, fm_rows))):
        torch.manual_seed(0)
        vm = VerticalModel(f.schema, 2)
        train_vertical(vm, b, y, cfg, z=z, tier=tiers)
        with torch.no_grad():
            head = b.select(torch.nonzero(zero_later).squeeze(-1))
            p = vm.predict_proba(head, torch.zeros(len(head), 32), served_zero)[:, 0]
        predicted[name] = float(p.mean())
    true = float(y[zero_later, 0].mean())
    assert abs(predicted["own tier"] - true) < 0.1, (predicted, true)
    assert predicted["as ZERO"] < true - 0.15, (predicted, true)


def test_the_fm_span_tier_reads_no_vector_and_old_cards_load(dataset: InteractionDataset) -> None:
    f = PairFeaturizer(dataset, history_len=8)
    b = f.for_log(dataset.interactions.iloc[:6])
    vm = VerticalModel(f.schema, 2)
    span = torch.full((6,), FM_SPAN_TIER)
    assert torch.equal(vm(b, torch.randn(6, 32), span), vm(b, torch.zeros(6, 32), span))
    assert fm_span_tiers(
        torch.full((3,), int(Tier.EXACT)), np.array([True, False, True])
    ).tolist() == [
        FM_SPAN_TIER,
        int(Tier.EXACT),
        FM_SPAN_TIER,
    ]
    saved = {k: v for k, v in vm.state_dict().items() if k != "fm_span_tier"}  # an older card
    loaded = VerticalModel(f.schema, 2)
    loaded.load_state_dict(saved)
    assert not loaded.fm_span_tier.any()
    assert torch.equal(loaded(b), vm(b))
