"""solaris's Feast online store: the resolved view through a plain Feast call, answered by the
retriever's read, and everything else answered as Feast's own store answers it.

Real Feast stores (SQLite and Redis) over one registry and one set of rows: every answer of the
solaris store is compared with the answer of Feast's own store of the same kind, and the
retriever's counters say which path answered.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import redis
import yaml
from conftest import free_port
from feast import FeatureStore
from google.protobuf.message import DecodeError
from ports import THROWAWAY_PORT
from test_hardening_support import owned_redis
from test_resolve_parity import (
    CFG,
    DIM,
    GARBAGE,
    RESOLVED,
    VERSION,
    feast_server,
    frozen_clock,  # noqa: F401  (a fixture)
    grid,
    post,
    solaris_store_of,
    write_grid,
    write_user_aggregate,
)
from test_resolve_parity import store as parity_store

from solaris_feast.errors import RetryableStoreError
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.serving.online_store import (
    OnlineStoreUnavailable,
    ResolvedViewReads,
    SolarisRedisOnlineStoreConfig,
    SolarisSqliteOnlineStoreConfig,
)
from solaris_feast.store.backends import backend_for, online_kind
from solaris_feast.store.config import (
    SOLARIS_ONLINE_STORE_TYPES,
    build_repo_config,
    open_repo_store,
    open_store,
)
from solaris_feast.store.definitions import (
    MODEL_VERSION_REQUEST_FIELD,
    SolarisFeastConfig,
    solaris_definitions,
)
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

WITH_EMBEDDING = [*RESOLVED, f"{CFG.resolved_view_name}:resolved_embedding"]
PAIR_FEATURES = [f"{CFG.pair_view_name}:{f}" for f in ("embedding", "model_version")]
VM_VERSION = "vm-20261205T231417-92e1c80e"
"""A VM card's version, what solaris train and promote print first."""


store = parity_store
"""The parity test's fixture: a real SQLite and a real Redis store with the views applied."""


def online_store(store: FeatureStore) -> ResolvedViewReads:
    reads = store._get_provider().online_store
    assert isinstance(reads, ResolvedViewReads)
    return reads


def fetches(store: FeatureStore) -> int:
    """Resolved reads this thread answered through the retriever."""
    return sum(stats.fetches for stats in online_store(store).thread_stats())


def rows(user: int, items: list[int], version: str = VERSION) -> list[dict[str, Any]]:
    return [{"user_id": user, "item_id": i, MODEL_VERSION_REQUEST_FIELD: version} for i in items]


def answer(store: FeatureStore, features: Any, entity_rows: Any, **kwargs: Any) -> dict[str, Any]:
    return store.get_online_features(
        features=features, entity_rows=entity_rows, full_feature_names=True, **kwargs
    ).to_dict()


def test_the_type_names_are_the_config_classes_own() -> None:
    assert SolarisRedisOnlineStoreConfig().type == SOLARIS_ONLINE_STORE_TYPES["redis"]
    assert SolarisSqliteOnlineStoreConfig().type == SOLARIS_ONLINE_STORE_TYPES["sqlite"]
    # Feast's own store checks pick the backend of the right kind for them.
    for kind, type_name in SOLARIS_ONLINE_STORE_TYPES.items():
        config = build_repo_config("p", Path("/tmp"), online=kind, resolve_in_store=True)  # type: ignore[arg-type]
        assert config.online_store.type == type_name
        assert online_kind(FeatureStore(config=config)) == kind


@pytest.mark.usefixtures("frozen_clock")
def test_many_users_versions_and_repeated_pairs_in_one_request_match_feast(
    store: FeatureStore,
) -> None:
    cases = grid()
    items = write_grid(store, CFG.pair_view_name, 1, cases)
    write_grid(store, CFG.similar_view_name, 2, cases)
    write_user_aggregate(store, 1)
    solaris = solaris_store_of(store, record_misses=False)
    # Users 1, 2 and one never written (3); a repeated pair; a version no vector was made by.
    entity_rows = (
        rows(1, items)
        + rows(2, items[::-1])
        + rows(3, [0, 1])
        + rows(1, [0, 0, 5])
        + rows(1, [0], "cmp-other")
    )

    expected = answer(store, WITH_EMBEDDING, entity_rows)
    got = answer(solaris, WITH_EMBEDDING, entity_rows)

    assert got == expected
    assert list(got) == list(expected)  # in Feast's column order too
    tiers = got[f"{CFG.resolved_view_name}__resolved_tier"]
    assert set(tiers) == {int(t) for t in Tier}
    assert tiers[-1] == Tier.ZERO  # another version's vector is never served
    assert fetches(solaris) == 4  # one read per (user, version)
    # One output alone, in the caller's order, is answered too.
    single = [f"{CFG.resolved_view_name}:resolved_tier"]
    assert answer(solaris, single, rows(1, items)) == answer(store, single, rows(1, items))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.usefixtures("frozen_clock")
def test_many_versions_go_to_feast_many_users_share_a_read_and_nothing_leaks(
    store: FeatureStore,
) -> None:
    """A request whose versions would overflow the retriever cache gets Feast's own answer; one
    of many users with a candidate each is answered by one batched read; the connections of
    retrievers pushed out of the cache are closed."""
    items = write_grid(store, CFG.pair_view_name, 1, {"fresh": grid()["fresh"]})
    write_user_aggregate(store, 1)
    solaris = solaris_store_of(store, record_misses=False)
    # 40 versions of 4 rows each: too many versions for the cache.
    many_versions = [
        {"user_id": 1, "item_id": i, MODEL_VERSION_REQUEST_FIELD: f"v{k}"}
        for k in range(40)
        for i in range(4)
    ]
    assert answer(solaris, WITH_EMBEDDING, many_versions) == answer(
        store, WITH_EMBEDDING, many_versions
    )
    assert fetches(solaris) == 0
    one_item_users = [row | {"user_id": user} for user, row in enumerate(rows(1, [items[0]] * 40))]
    got = answer(solaris, WITH_EMBEDDING, one_item_users)
    assert got == answer(store, WITH_EMBEDDING, one_item_users)
    assert got[f"{CFG.resolved_view_name}__resolved_tier"][1] == Tier.EXACT  # user 1's vector
    assert fetches(solaris) == 40  # 40 users' requests, in one read
    # 16 versions, 4 rows each: the fast read, with every retriever of the cache replaced.
    cache_full = [
        {"user_id": 1, "item_id": i, MODEL_VERSION_REQUEST_FIELD: f"w{k}"}
        for k in range(16)
        for i in range(4)
    ]
    answer(solaris, WITH_EMBEDDING, cache_full)  # warm: 16 retrievers, one connection each
    before = _open_fds()
    for round_ in range(3):
        renamed = [
            row | {MODEL_VERSION_REQUEST_FIELD: f"r{round_}-{row[MODEL_VERSION_REQUEST_FIELD]}"}
            for row in cache_full
        ]
        assert answer(solaris, WITH_EMBEDDING, renamed) == answer(store, WITH_EMBEDDING, renamed)
        answer(solaris, WITH_EMBEDDING, many_versions)  # made a retriever per version before
    assert fetches(solaris) == 16  # the cache keeps the last 16 versions' retrievers
    assert _open_fds() <= before + 2  # the 48 pushed out closed their connections


@pytest.mark.usefixtures("frozen_clock")
def test_other_requests_are_feasts_own_answers(store: FeatureStore) -> None:
    items = write_grid(store, CFG.pair_view_name, 1, {"fresh": grid()["fresh"]})
    write_user_aggregate(store, 1)
    solaris = solaris_store_of(store, record_misses=False)
    entity_rows = rows(1, items)

    # A plain view and a feature service.
    assert answer(solaris, PAIR_FEATURES, entity_rows) == answer(store, PAIR_FEATURES, entity_rows)
    service = store.get_feature_service(CFG.service_name)
    assert answer(solaris, service, entity_rows) == answer(store, service, entity_rows)
    # Short names: refused with Feast's own message, as on Feast's store.
    with pytest.raises(ValueError, match="full_feature_names=True"):
        solaris.get_online_features(features=RESOLVED, entity_rows=entity_rows)
    # A request without the version field: Feast names what is missing.
    with pytest.raises(Exception, match=MODEL_VERSION_REQUEST_FIELD) as feast_error:
        store.get_online_features(
            features=RESOLVED, entity_rows=[{"user_id": 1, "item_id": 0}], full_feature_names=True
        )
    with pytest.raises(type(feast_error.value), match=MODEL_VERSION_REQUEST_FIELD):
        solaris.get_online_features(
            features=RESOLVED, entity_rows=[{"user_id": 1, "item_id": 0}], full_feature_names=True
        )

    # Ids the retriever refuses (a float, an unhashable list): Feast's own answer or error.
    def outcome(on: FeatureStore, bad_rows: list[dict[str, Any]]) -> object:
        try:
            return answer(on, RESOLVED, bad_rows)
        except Exception as exc:  # whatever Feast raises, both stores must raise it
            return type(exc), str(exc)

    for bad in (1.5, [1], {"sku": 1}):
        bad_rows = [{"user_id": 1, "item_id": bad, MODEL_VERSION_REQUEST_FIELD: VERSION}]
        assert outcome(solaris, bad_rows) == outcome(store, bad_rows)
    assert fetches(solaris) == 0  # none of these was answered by the retriever


@pytest.mark.usefixtures("frozen_clock")
def test_the_resolved_view_mixed_with_other_views_is_answered_as_feast_answers_it(
    store: FeatureStore,
) -> None:
    items = write_grid(store, CFG.pair_view_name, 1, {"fresh": grid()["fresh"]})
    write_user_aggregate(store, 1)
    solaris = solaris_store_of(store, record_misses=False)
    entity_rows = rows(1, [*items, 3])
    user_only = [f"{CFG.user_view_name}:pair_count"]  # keyed by user alone

    for mixed in (
        [*RESOLVED, *PAIR_FEATURES],
        [*PAIR_FEATURES, *WITH_EMBEDDING],
        [*user_only, *RESOLVED],
    ):
        expected = answer(store, mixed, entity_rows)
        got = answer(solaris, mixed, entity_rows)
        assert got == expected
        assert list(got) == list(expected)  # and in Feast's column order
    assert fetches(solaris) == 3  # the resolved view was read by the retriever each time


@pytest.mark.usefixtures("frozen_clock")
def test_an_undecodable_value_is_a_miss_where_feast_fails_the_request(store: FeatureStore) -> None:
    cases = {"garbage": (60.0, VERSION, GARBAGE, False), "fresh": grid()["fresh"]}
    items = write_grid(store, CFG.pair_view_name, 1, cases)
    write_user_aggregate(store, 1)
    solaris = solaris_store_of(store, record_misses=False)

    with pytest.raises(DecodeError):
        answer(store, RESOLVED, rows(1, items))
    got = answer(solaris, RESOLVED, rows(1, items))

    # The garbage value falls to the user aggregate; the good one next to it is served.
    assert got[f"{CFG.resolved_view_name}__resolved_tier"] == [Tier.USER_AGG, Tier.EXACT]
    assert online_store(solaris).thread_stats()[0].undecodable == 1


@pytest.mark.usefixtures("frozen_clock")
def test_exact_misses_are_queued_for_the_planner_unless_turned_off(store: FeatureStore) -> None:
    items = write_grid(store, CFG.pair_view_name, 1, {"fresh": grid()["fresh"]})
    queue = MissQueue(store.config.project, backend=backend_for(store, timeout_seconds=5.0))
    quiet = solaris_store_of(store, record_misses=False)

    answer(quiet, RESOLVED, rows(1, [*items, 40, 41]))
    assert queue.pending() == 0
    answer(solaris_store_of(store), RESOLVED, rows(1, [*items, 40, 41]))
    assert queue.pending() == 2  # items 40 and 41; the exact item is not a miss
    # Taking none (a round with max_drained_misses 0) takes none, on Redis too (its drain
    # script failed on XRANGE COUNT 0's nil).
    assert queue.drain(0).empty and queue.pending() == 2
    queue.close()


def test_a_request_without_the_item_is_refused_where_feasts_read_answers_aggregates(
    store: FeatureStore,
) -> None:
    """Without item_id Feast's own read finds no pair and the user's row: every row came back
    as the user's aggregate (tier 1), a wrong answer with a 200 for a malformed request."""
    from solaris_feast.serving.online_store import ResolvedRequestRefused

    write_user_aggregate(store, 1)
    no_item = [{"user_id": 1, MODEL_VERSION_REQUEST_FIELD: VERSION}] * 2
    assert (
        answer(store, RESOLVED, no_item)[f"{CFG.resolved_view_name}__resolved_tier"]
        == [Tier.USER_AGG] * 2
    )
    with pytest.raises(ResolvedRequestRefused, match=r"needs item_id in every entity row") as no:
        answer(solaris_store_of(store), RESOLVED, no_item)
    assert no.value.http_status_code() == 422


def test_a_vm_version_in_a_request_is_refused_naming_the_version_to_send(
    store: FeatureStore,
) -> None:
    """The VM's version (what solaris train and promote print first) matches no stored vector:
    it once answered ZERO for every pair and queued misses under it, with nothing said."""
    from solaris_feast.errors import ConfigError

    write_grid(store, CFG.pair_view_name, 1, {"fresh": grid()["fresh"]})
    queue = MissQueue(store.config.project, backend=backend_for(store, timeout_seconds=5.0))
    with pytest.raises(ConfigError, match=rf"'{VM_VERSION}' is the VM's.*compressor's"):
        answer(solaris_store_of(store), RESOLVED, rows(1, [40, 41], version=VM_VERSION))
    assert queue.pending() == 0
    queue.close()
    from solaris_feast.serving.retriever import SolarisRetriever

    with pytest.raises(ConfigError, match=rf"'{VM_VERSION}' is the VM's"):
        SolarisRetriever(store, VM_VERSION)


def test_feast_teardown_removes_the_projects_miss_queue(store: FeatureStore) -> None:
    """Feast's teardown removes the views' rows; the miss queue is the plugin's own and stayed
    (a Redis stream without expiry, with its round markers), so a project applied again under
    the same name drained misses recorded before the teardown."""
    serving = solaris_store_of(store)
    answer(serving, RESOLVED, rows(1, [40, 41, 42]))
    queue = MissQueue(store.config.project, backend=backend_for(store, timeout_seconds=5.0))
    assert queue.pending() == 3
    queue.close()
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    project_keys = f"solaris:{{{store.config.project}}}:*"
    if online_kind(store) == "redis":
        assert list(redis.Redis.from_url(redis_url).scan_iter(match=project_keys))

    # What `feast teardown` calls (FeatureStore.teardown also deletes the fixture's registry).
    views = serving.list_feature_views()
    online_store(serving).teardown(serving.config, views, serving.list_entities())

    queue = MissQueue(store.config.project, backend=backend_for(store, timeout_seconds=5.0))
    assert queue.pending() == 0
    queue.close()
    if online_kind(store) == "redis":
        assert not list(redis.Redis.from_url(redis_url).scan_iter(match=project_keys))


def test_a_store_that_is_down_raises_a_retryable_error(
    feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    applied = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    applied.apply(solaris_definitions(CFG).all())
    store = open_store(  # the same registry, and a Redis that is not there
        feast_project,
        tmp_path,
        online="redis",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        resolve_in_store=True,
    )

    with pytest.raises(RetryableStoreError, match="online store read") as down:
        answer(store, RESOLVED, rows(1, [0, 1]))
    # A Feast error too, with the status feast serve answers: retry, not a server bug.
    assert isinstance(down.value, OnlineStoreUnavailable)
    assert down.value.http_status_code() == 503
    # Feast's own read of a plain view fails too, with redis-py's error.
    with pytest.raises(redis.exceptions.ConnectionError):
        answer(store, PAIR_FEATURES, [{"user_id": 1, "item_id": 0}])


def test_views_under_a_users_own_names_are_answered(
    feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    names = SolarisFeastConfig(
        pair_view_name="ads_z_pair",
        similar_view_name="ads_z_similar",
        user_view_name="ads_z_user",
        resolved_view_name="ads_z",
        service_name="ads_z_all",
        clock_skew_seconds=5.0,
    )
    stock = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    stock.apply(solaris_definitions(names).all())
    solaris = solaris_store_of(stock, record_misses=False)
    frame_rows = [
        {
            "user_id": 1,
            "item_id": item,
            "embedding": np.full(DIM, 0.1 * item, np.float32).tolist(),
            "model_version": VERSION,
        }
        for item in range(3)
    ]
    now = pd.Timestamp.now(tz="UTC").floor("s")
    frame = pd.DataFrame(frame_rows).assign(computed_at=now)
    EmbeddingWriter(stock, "ads_z_pair", offline=False).write(frame)
    features = [f"ads_z:{f}" for f in ("resolved_tier", "resolved_embedding")]

    got = answer(solaris, features, rows(1, [0, 1, 2, 3]))

    assert got == answer(stock, features, rows(1, [0, 1, 2, 3]))
    assert got["ads_z__resolved_tier"] == [Tier.EXACT] * 3 + [Tier.ZERO]
    assert fetches(solaris) == 1


def write_solaris_repo_yaml(project: str, repo: Path, redis_url: str) -> None:
    """A feature_store.yaml with the solaris Redis store, as a user writes it for feast serve."""
    config = build_repo_config(project, repo, online="redis", redis_url=redis_url)
    (repo / "feature_store.yaml").write_text(
        yaml.safe_dump(
            {
                "project": project,
                "provider": "local",
                "registry": {"registry_type": "file", "path": config.registry.path},
                "online_store": {
                    "type": SOLARIS_ONLINE_STORE_TYPES["redis"],
                    "connection_string": config.online_store.connection_string,
                    "record_misses": False,
                },
                "offline_store": {"type": "file"},
                "entity_key_serialization_version": 3,
            }
        )
    )


def test_feast_serve_answers_the_resolved_view_through_the_solaris_store(
    feast_project: str, tmp_path: Path, redis_url: str
) -> None:
    write_solaris_repo_yaml(feast_project, tmp_path, redis_url)
    solaris = open_repo_store(tmp_path)  # the yaml as Feast reads it
    assert solaris.config.online_store.record_misses is False
    stock = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    stock.apply(solaris_definitions(CFG).all())
    items = write_grid(stock, CFG.pair_view_name, 1, {"fresh": (60.0, VERSION, np.ones(DIM), True)})
    write_user_aggregate(stock, 1)
    ids = [*items, 9]
    entities: dict[str, list[Any]] = {
        "user_id": [1] * len(ids),
        "item_id": ids,
        MODEL_VERSION_REQUEST_FIELD: [VERSION] * len(ids),
    }
    body = {"features": WITH_EMBEDDING, "entities": entities, "full_feature_names": True}

    with feast_server(tmp_path, free_port()) as url:
        status, served = post(url, body)
        plain_status, plain = post(
            url, {"features": PAIR_FEATURES, "entities": {"user_id": [1], "item_id": [0]}}
        )
        # Short names are the client's mistake: a 422 naming the fix, not a 500.
        short_status, short = post(url, {**body, "full_feature_names": False})
        # So is the VM's version: no vector is stored under it.
        vm_entities = {**entities, MODEL_VERSION_REQUEST_FIELD: [VM_VERSION] * len(ids)}
        vm_status, vm_answer = post(url, {**body, "entities": vm_entities})

    assert short_status == 422 and "full_feature_names=True" in str(short), short
    refusal = str(vm_answer)
    assert vm_status == 422 and VM_VERSION in refusal and "is the VM" in refusal, vm_answer
    assert status == 200, served
    names = served["metadata"]["feature_names"]
    tiers = served["results"][names.index(f"{CFG.resolved_view_name}__resolved_tier")]
    assert tiers["values"] == [Tier.EXACT, Tier.USER_AGG]
    vectors = served["results"][names.index(f"{CFG.resolved_view_name}__resolved_embedding")]
    expected = answer(stock, WITH_EMBEDDING, rows(1, ids))
    assert vectors["values"] == expected[f"{CFG.resolved_view_name}__resolved_embedding"]
    assert plain_status == 200, plain


def test_bench_serve_times_the_solaris_store_beside_feasts_own(redis_url: str) -> None:
    from solaris_feast.bench import run_serve_benchmark

    results = run_serve_benchmark(
        redis_url, candidates=(100,), iterations=10, with_feast_server=False
    )

    at_100 = results["candidates"]["100"]
    for name in (
        "feast_single_view_solaris_store",
        "feast_resolved_view_solaris_store",
        "feast_two_views",
        "feast_mixed_view_solaris_store",
    ):
        assert at_100[name]["p50_ms"] > 0
    assert results["feast_mixed_solaris_store_vs_two_views_p50"] == round(
        results["feast_mixed_view_solaris_store_p50_ms"] / results["feast_two_views_p50_ms"], 3
    )
    assert results["feast_resolved_solaris_store_vs_single_view_p50"] == round(
        results["feast_resolved_view_solaris_store_p50_ms"] / results["feast_single_view_p50_ms"],
        3,
    )


def test_the_switch_in_the_repos_redis_yaml_loads_in_feast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from feast.repo_config import load_repo_config

    repo_yaml = Path(__file__).parents[1] / "feature_repo" / "feature_store.redis.yaml"
    text = repo_yaml.read_text()
    switch = f"  #   type: {SOLARIS_ONLINE_STORE_TYPES['redis']}\n"
    assert switch in text  # the line the comment tells a user to use
    (tmp_path / "feature_store.yaml").write_text(
        text.replace("  type: redis\n", switch.replace("#   ", ""))
    )
    monkeypatch.setenv("SOLARIS_REDIS_CONNECTION", "127.0.0.1:6379")

    config = load_repo_config(tmp_path, tmp_path / "feature_store.yaml")

    assert isinstance(config.online_store, SolarisRedisOnlineStoreConfig)
    assert config.online_store.record_misses is True


def test_feast_serve_answers_503_while_redis_is_down_and_serves_again_after_it_restarts(
    feast_project: str, tmp_path: Path
) -> None:
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis") as server:
        write_solaris_repo_yaml(feast_project, tmp_path, server.url)
        stock = open_store(feast_project, tmp_path, online="redis", redis_url=server.url)
        stock.apply(solaris_definitions(CFG).all())
        entities = {
            "user_id": [1, 1],
            "item_id": [0, 1],
            MODEL_VERSION_REQUEST_FIELD: [VERSION, VERSION],
        }
        body = {"features": WITH_EMBEDDING, "entities": entities, "full_feature_names": True}
        with feast_server(tmp_path, free_port()) as url:
            up_status, _ = post(url, body)
            server.kill()
            down_status, down = post(url, body)
            server.start()  # empty: a Redis that keeps nothing on disk
            back_status, back = post(url, body)

    assert up_status == 200
    # A load balancer retries a 503; the message names the server and the cause.
    assert down_status == 503, down
    assert f"127.0.0.1:{THROWAWAY_PORT}" in str(down), down
    assert back_status == 200, back
    names = back["metadata"]["feature_names"]
    tiers = back["results"][names.index(f"{CFG.resolved_view_name}__resolved_tier")]
    assert tiers["values"] == [Tier.ZERO, Tier.ZERO]


def test_a_larger_request_gets_the_deadline_in_proportion() -> None:
    """Feast's own store answers a 50,000-row batch in its own time; a fixed second failed it
    where the store this one stands in for answered."""
    from solaris_feast.serving.online_store import ROWS_PER_DEADLINE, request_deadline_ms

    assert request_deadline_ms(1000.0, 1) == 1000.0
    assert request_deadline_ms(1000.0, ROWS_PER_DEADLINE) == 1000.0
    assert request_deadline_ms(1000.0, 50 * ROWS_PER_DEADLINE) == 50_000.0
    assert request_deadline_ms(20.0, 5 * ROWS_PER_DEADLINE // 2) == 50.0
