"""The retriever and Feast's resolved view apply one tier rule: same tier for every pair of a grid.

Each case of the grid is stored in the exact tier (user 1, whose user aggregate is fresh: a miss
falls to USER_AGG) and in the similar tier (user 2, no aggregate: a miss falls to ZERO), on a real
SQLite and a real Redis online store. The clock is frozen at an integer second for the reads, so
the TTL and clock-skew boundaries are hit to the second; the view's generated source reads the
time through ``time.time`` like the retriever, which makes that possible.

Bytes that are not a Feast value at all (garbage, truncated) are a miss for the retriever; Feast's
own online read raises ``DecodeError`` for the whole request before the view runs, on both stores
(pinned here: if Feast starts to tolerate them, the view must answer a miss and this test says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pytest
import redis
import yaml
from conftest import free_port
from feast.protos.feast.types.Value_pb2 import FloatList
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from google.protobuf.message import DecodeError

from solaris_feast.serving.resolve import DEFAULT_CLOCK_SKEW_SECONDS
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.backends import online_kind
from solaris_feast.store.backends.sqlite import sqlite_path
from solaris_feast.store.config import build_repo_config, open_store
from solaris_feast.store.definitions import (
    MODEL_VERSION_REQUEST_FIELD,
    SolarisFeastConfig,
    solaris_definitions,
)
from solaris_feast.store.layout import EntityKeyLayout, online_field, sqlite_table
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 32
VERSION = "cmp-parity-v1"
CFG = SolarisFeastConfig()
TTL = float(CFG.pair_ttl_seconds)
assert CFG.similar_ttl_seconds == CFG.pair_ttl_seconds  # one age grid serves both tiers
SKEW = DEFAULT_CLOCK_SKEW_SECONDS
NOW = float(int(time.time()))  # whole seconds: Feast stores computed_at in seconds
RESOLVED = [
    f"{CFG.resolved_view_name}:resolved_tier",
    f"{CFG.resolved_view_name}:resolved_age_seconds",
]

WRONG_TYPE = ValueProto(string_val="not a vector").SerializeToString()
GARBAGE = b"\xff\xfe\x00 not a protobuf \x99"
TRUNCATED = ValueProto(float_list_val=FloatList(val=[0.5] * DIM)).SerializeToString()[:40]


# name: (age in seconds, model version, vector or raw bytes or None for absent, served?)
def grid() -> dict[str, tuple[float, str, Any, bool]]:
    ok = np.full(DIM, 0.5, dtype=np.float32)
    nan, inf = ok.copy(), ok.copy()
    nan[3], inf[5] = np.nan, -np.inf
    return {
        "fresh": (60.0, VERSION, ok, True),
        "ttl_minus_1s": (TTL - 1, VERSION, ok, True),
        "exactly_ttl": (TTL, VERSION, ok, True),
        "ttl_plus_1s": (TTL + 1, VERSION, ok, False),
        "stale": (3 * TTL, VERSION, ok, False),
        "other_version": (60.0, "cmp-old", ok, False),
        "absent": (60.0, VERSION, None, False),
        "nan": (60.0, VERSION, nan, False),
        "inf": (60.0, VERSION, inf, False),
        "wrong_length": (60.0, VERSION, ok[: DIM - 1], False),
        "wrong_type": (60.0, VERSION, WRONG_TYPE, False),
        "future_within_skew": (-(SKEW - 1), VERSION, ok, True),
        "future_at_skew": (-SKEW, VERSION, ok, True),
        "future_beyond_skew": (-(SKEW + 1), VERSION, ok, False),
        "far_future": (-5 * 365 * 86400.0, VERSION, ok, False),
    }


UNDECODABLE = {"garbage": GARBAGE, "truncated": TRUNCATED}


@pytest.fixture(params=["sqlite", "redis"])
def store(
    request: pytest.FixtureRequest, feast_project: str, tmp_path: Path, redis_url: str
) -> FeatureStore:
    feast_store = open_store(feast_project, tmp_path, online=request.param, redis_url=redis_url)
    feast_store.apply(solaris_definitions(CFG).all())
    return feast_store


def write_raw(store: FeatureStore, view: str, key: bytes, feature: str, value: bytes) -> None:
    """Overwrite one stored value with bytes Feast's writer would never produce."""
    project = store.config.project
    if online_kind(store) == "redis":
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        client.hset(key + project.encode(), online_field(view, feature), value)
        return
    with contextlib.closing(sqlite3.connect(sqlite_path(store))) as conn:
        updated = conn.execute(
            f'UPDATE "{sqlite_table(project, view)}" SET value = ? '
            "WHERE entity_key = ? AND feature_name = ?",
            (value, key, feature),
        ).rowcount
        conn.commit()
    assert updated == 1


def snapshot(store: FeatureStore) -> dict[Any, Any]:
    """Every stored byte of this project (to prove reads change nothing)."""
    project = store.config.project
    if online_kind(store) == "redis":
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        return {k: client.hgetall(k) for k in client.scan_iter(match=f"*{project}")}
    with contextlib.closing(sqlite3.connect(sqlite_path(store))) as conn:
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if r[0].startswith(project)
        ]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables}


def write_grid(store: FeatureStore, view: str, user: int, cases: dict[str, Any]) -> list[int]:
    """One item per case (item = its position); values that are not vectors are written raw."""
    pair_key = EntityKeyLayout(["user_id", "item_id"], 3)
    rows, raw = [], []
    stamp = pd.Timestamp(NOW - 10, unit="s", tz="UTC")
    for item, (age, version, value, _) in enumerate(cases.values()):
        if value is None:
            continue
        vector = value if isinstance(value, np.ndarray) else np.full(DIM, 0.5, np.float32)
        rows.append(
            {
                "user_id": user,
                "item_id": item,
                "embedding": [float(x) for x in vector],
                "model_version": version,
                "computed_at": pd.Timestamp(NOW - age, unit="s", tz="UTC"),
                "event_timestamp": stamp,
                "written_at": stamp,
            }
        )
        if isinstance(value, bytes):
            raw.append((pair_key.key(user, item), value))
    frame = pd.DataFrame(rows)
    if view == CFG.similar_view_name:
        frame["neighbour_count"] = 3
        frame["mean_distance"] = 0.5
    store.write_to_online_store(view, frame)
    for key, value in raw:
        write_raw(store, view, key, "embedding", value)
    return list(range(len(cases)))


def write_user_aggregate(store: FeatureStore, user: int) -> None:
    stamp = pd.Timestamp(NOW - 10, unit="s", tz="UTC")
    store.write_to_online_store(
        CFG.user_view_name,
        pd.DataFrame(
            {
                "user_id": [user],
                "embedding": [[0.25] * DIM],
                "pair_count": [5],
                "model_version": [VERSION],
                "computed_at": [pd.Timestamp(NOW - 600, unit="s", tz="UTC")],
                "event_timestamp": [stamp],
                "written_at": [stamp],
            }
        ),
    )


def solaris_store_of(store: FeatureStore, **online_options: Any) -> FeatureStore:
    """The same project, registry and rows, read through solaris's Feast online store."""
    from feast import FeatureStore as FeastStore

    config = build_repo_config(
        store.config.project,
        Path(str(store.config.repo_path)),
        online=online_kind(store),
        redis_url=os.environ.get("REDIS_URL"),
        resolve_in_store=True,
    )
    # The tests check answers, not speed: a 2-core CI machine under load has taken over the
    # production default of one second for a read, which raised DeadlineExceededError.
    online_options.setdefault("deadline_ms", 30_000.0)
    for name, value in online_options.items():
        setattr(config.online_store, name, value)
    return FeastStore(config=config)


def resolved_view(
    store: FeatureStore, user: int, items: list[int], features: list[str] = RESOLVED
) -> dict[str, list[Any]]:
    answer = store.get_online_features(
        features=features,
        entity_rows=[
            {"user_id": user, "item_id": i, MODEL_VERSION_REQUEST_FIELD: VERSION} for i in items
        ],
        full_feature_names=True,
    ).to_dict()
    return {
        "tiers": answer[f"{CFG.resolved_view_name}__resolved_tier"],
        "ages": answer[f"{CFG.resolved_view_name}__resolved_age_seconds"],
    } | {k: v for k, v in answer.items() if not k.startswith(f"{CFG.resolved_view_name}__")}


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sides read ``time.time``; freeze it so a boundary case is on the boundary."""
    monkeypatch.setattr(time, "time", lambda: NOW)


def test_retriever_and_resolved_view_give_the_same_tier_for_every_case(
    store: FeatureStore, frozen_clock: None
) -> None:
    cases = grid()
    items = write_grid(store, CFG.pair_view_name, 1, cases)
    write_grid(store, CFG.similar_view_name, 2, cases)
    write_user_aggregate(store, 1)
    before = snapshot(store)
    retriever = SolarisRetriever(store, VERSION, record_misses=False)

    exact = retriever.fetch(1, items)
    similar = retriever.fetch(2, items)
    view_exact = resolved_view(store, 1, items)
    view_similar = resolved_view(store, 2, items)

    served = [case[3] for case in cases.values()]
    expected_exact = [int(Tier.EXACT) if s else int(Tier.USER_AGG) for s in served]
    expected_similar = [int(Tier.SIMILAR) if s else int(Tier.ZERO) for s in served]
    names = list(cases)
    assert dict(zip(names, exact.tiers.tolist(), strict=True)) == dict(
        zip(names, expected_exact, strict=True)
    )
    assert dict(zip(names, view_exact["tiers"], strict=True)) == dict(
        zip(names, expected_exact, strict=True)
    )
    assert dict(zip(names, similar.tiers.tolist(), strict=True)) == dict(
        zip(names, expected_similar, strict=True)
    )
    assert dict(zip(names, view_similar["tiers"], strict=True)) == dict(
        zip(names, expected_similar, strict=True)
    )
    # A request where every stored value is a D-float list takes the view's one-array fast path
    # (no null, no other length or type among them): the same answer.
    whole = [
        i
        for i, (_, _, v, _) in enumerate(cases.values())
        if isinstance(v, np.ndarray) and len(v) == DIM
    ]
    assert len(whole) >= 10
    assert resolved_view(store, 1, whole)["tiers"] == [expected_exact[i] for i in whole]
    assert resolved_view(store, 2, whole)["tiers"] == [expected_similar[i] for i in whole]
    # Ages agree too: clipped at 0 for the future within the skew, -1 (view) / NaN for ZERO.
    ages = np.where(np.isnan(similar.age_seconds), -1.0, similar.age_seconds)
    np.testing.assert_array_equal(np.asarray(view_similar["ages"]), ages)
    assert exact.age_seconds[names.index("exactly_ttl")] == TTL
    assert exact.age_seconds[names.index("future_within_skew")] == 0.0
    # Refusals are counted by reason (user 1 and user 2 each see every case once).
    assert retriever.stats.rejected == {
        "other_version": 2,
        "stale": 4,
        "future": 4,
        "non_finite": 4,
    }
    assert retriever.stats.undecodable == 4  # wrong_length and wrong_type, twice
    assert snapshot(store) == before

    # solaris's Feast online store answers the same plain Feast call with the retriever's read:
    # the same columns, tiers, ages and vectors as the on-demand view, for both users.
    solaris = solaris_store_of(store, record_misses=False)
    with_embedding = [*RESOLVED, f"{CFG.resolved_view_name}:resolved_embedding"]
    for user in (1, 2):
        feast_answer = resolved_view(store, user, items, with_embedding)
        solaris_answer = resolved_view(solaris, user, items, with_embedding)
        assert solaris_answer == feast_answer
    assert snapshot(store) == before


def test_undecodable_bytes_are_a_counted_miss_for_the_retriever_and_change_nothing(
    store: FeatureStore, frozen_clock: None
) -> None:
    write_user_aggregate(store, 1)
    cases = {name: (60.0, VERSION, raw, False) for name, raw in UNDECODABLE.items()} | {
        "fresh": (60.0, VERSION, np.full(DIM, 0.5, np.float32), True)
    }
    items = write_grid(store, CFG.pair_view_name, 1, cases)
    # A computed_at that is not a timestamp is as untrusted as a bad vector.
    bad_stamp = EntityKeyLayout(["user_id", "item_id"], 3).key(1, items[-1])
    write_raw(store, CFG.pair_view_name, bad_stamp, "computed_at", GARBAGE)
    before = snapshot(store)
    retriever = SolarisRetriever(store, VERSION, record_misses=False, strict=False)

    result = retriever.fetch(1, items)

    assert not result.error
    assert result.tiers.tolist() == [Tier.USER_AGG] * 3
    assert retriever.stats.undecodable == 3
    assert snapshot(store) == before
    # A garbage user aggregate is one stored value, a miss for (and counted with) each candidate.
    write_user_aggregate(store, 3)
    user_key = EntityKeyLayout(["user_id"], 3).key(3)
    write_raw(store, CFG.user_view_name, user_key, "embedding", TRUNCATED)
    before = snapshot(store)
    assert retriever.fetch(3, [0, 1, 2]).tiers.tolist() == [Tier.ZERO] * 3
    assert retriever.stats.undecodable == 3 + 3
    assert snapshot(store) == before
    # Feast itself cannot read the row: its online read raises for the whole request before
    # the resolved view runs (feast 0.67, both stores). Pinned so a change in Feast is noticed.
    with pytest.raises(DecodeError, match="Wire format was corrupt"):
        resolved_view(store, 1, items[:1])
    assert snapshot(store) == before


def test_retriever_clock_skew_is_configurable(store: FeatureStore, frozen_clock: None) -> None:
    cases = {"ahead_10_min": (-600.0, VERSION, np.full(DIM, 0.5, np.float32), False)}
    items = write_grid(store, CFG.pair_view_name, 1, cases)

    default = SolarisRetriever(store, VERSION, record_misses=False)
    lenient = SolarisRetriever(store, VERSION, record_misses=False, clock_skew_seconds=900.0)

    assert default.fetch(1, items).tiers.tolist() == [Tier.ZERO]
    assert default.stats.rejected["future"] == 1
    assert lenient.fetch(1, items).tiers.tolist() == [Tier.EXACT]
    with pytest.raises(ValueError, match="clock_skew_seconds"):
        SolarisRetriever(store, VERSION, record_misses=False, clock_skew_seconds=-1.0)


def test_resolved_view_refuses_short_feature_names_on_every_store(store: FeatureStore) -> None:
    write_grid(store, CFG.pair_view_name, 1, {"fresh": grid()["fresh"]})
    write_user_aggregate(store, 1)
    row = {"user_id": 1, "item_id": 0, MODEL_VERSION_REQUEST_FIELD: VERSION}

    with pytest.raises(ValueError, match="full_feature_names=True") as refused:
        store.get_online_features(features=RESOLVED, entity_rows=[row], full_feature_names=False)
    # A Feast error with a client status: feast serve answers 422, not a 500.
    from feast.errors import FeastError

    assert isinstance(refused.value, FeastError) and refused.value.http_status_code() == 422
    # The same request with full names is answered (the refusal is about the names only).
    answer = store.get_online_features(
        features=RESOLVED, entity_rows=[row], full_feature_names=True
    )
    assert answer.to_dict()[f"{CFG.resolved_view_name}__resolved_tier"] == [Tier.EXACT]


@contextlib.contextmanager
def feast_server(repo: Path, port: int) -> Iterator[str]:
    feast = Path(sys.executable).with_name("feast")
    log = (repo / "serve.log").open("wb")
    proc = subprocess.Popen(
        [str(feast), "serve", "-h", "127.0.0.1", "-p", str(port), "--no-access-log"],
        cwd=repo,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"feast serve did not start: {(repo / 'serve.log').read_text()[-2000:]}"
                    ) from exc
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/get-online-features",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")}


def test_feast_serve_on_sqlite_does_not_answer_short_names_with_rows(
    feast_project: str, tmp_path: Path
) -> None:
    config = build_repo_config(feast_project, tmp_path, online="sqlite")
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "feature_store.yaml").write_text(
        yaml.safe_dump(
            {
                "project": feast_project,
                "provider": "local",
                "registry": {"registry_type": "file", "path": config.registry.path},
                "online_store": {"type": "sqlite", "path": config.online_store.path},
                "offline_store": {"type": "file"},
                "entity_key_serialization_version": 3,
            }
        )
    )
    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(solaris_definitions(CFG).all())
    write_grid(store, CFG.pair_view_name, 1, {"fresh": (60.0, VERSION, np.ones(DIM), True)})
    body = {
        "features": RESOLVED,
        "entities": {"user_id": [1], "item_id": [0], MODEL_VERSION_REQUEST_FIELD: [VERSION]},
    }

    with feast_server(tmp_path, free_port()) as url:
        short_status, short_answer = post(url, {**body, "full_feature_names": False})
        full_status, full_answer = post(url, {**body, "full_feature_names": True})

    assert short_status != 200, short_answer
    assert "full_feature_names=True" in short_answer["error"]
    assert full_status == 200, full_answer
    names = full_answer["metadata"]["feature_names"]
    tier = full_answer["results"][names.index(f"{CFG.resolved_view_name}__resolved_tier")]
    assert tier["values"] == [Tier.EXACT]
