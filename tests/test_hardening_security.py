"""Security: Redis secrets come from the environment and reach no file and no log line; model
artifacts load only after their sha256 matches the card, through safetensors; nothing stored
(weights, online values) is unpickled or evaluated.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import pickle
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import ports
import pytest
import redis
from test_hardening_support import (
    DIM,
    THROWAWAY_PORT,
    VERSION,
    owned_redis,
    pair_frame,
    wait_until,
)

from solaris_feast.errors import ArtifactIntegrityError
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.backends.redis import redis_client
from solaris_feast.store.config import (
    REDIS_CONNECTION_ENV,
    build_repo_config,
    export_redis_connection,
    open_store,
    redis_connection_string,
)
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_rediss_url_becomes_a_tls_connection_with_credentials_from_the_url_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis.connection

    url = "rediss://alice:p%40ss%3Aw0rd@cache.internal:6380/2"
    assert redis_connection_string(url) == (
        "cache.internal:6380,db=2,username=alice,password=p@ss:w0rd,ssl=true"
    )
    monkeypatch.setenv("REDIS_URL", url)
    assert export_redis_connection() == redis_connection_string(url)
    assert os.environ[REDIS_CONNECTION_ENV].endswith("ssl=true")

    from feast import FeatureStore

    store = FeatureStore(config=build_repo_config("solaris_hard_tls", tmp_path, online="redis"))
    client = redis_client(store, timeout_seconds=0.05)
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.connection.SSLConnection
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.internal", 6380, 2)
    assert (kwargs["username"], kwargs["password"]) == ("alice", "p@ss:w0rd")
    for bad in ("http://cache:6379", "redis://cache:6379/zero"):
        with pytest.raises(ValueError, match="REDIS_URL"):
            redis_connection_string(bad)


TLS_PORT = ports.TLS_PORT


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, str, Path]]:
    """A redis-server that speaks only TLS, with a password; yields (port, password, CA file)."""
    certs = tmp_path / "tls"
    certs.mkdir()
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(certs / "key.pem"), "-out", str(certs / "cert.pem"),
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    password = f"tls-{secrets.token_hex(12)}"
    proc = subprocess.Popen(
        [
            "redis-server", "--port", "0", "--tls-port", str(TLS_PORT), "--bind", "127.0.0.1",
            "--tls-cert-file", str(certs / "cert.pem"), "--tls-key-file", str(certs / "key.pem"),
            "--tls-auth-clients", "no", "--requirepass", password, "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(
            host="127.0.0.1",
            port=TLS_PORT,
            ssl=True,
            ssl_ca_certs=str(certs / "cert.pem"),
            password=password,
        )

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        assert wait_until(answers, timeout_s=10), "the TLS redis-server did not answer"
        client.close()
        yield TLS_PORT, password, certs / "cert.pem"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_rediss_url_from_the_environment_serves_over_verified_tls(
    feast_project: str,  # first: its teardown must see the real REDIS_URL again
    tls_redis: tuple[int, str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port, password, ca_file = tls_redis
    # Python's default TLS context trusts SSL_CERT_FILE: how a deployment adds a private CA.
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    monkeypatch.setenv("REDIS_URL", f"rediss://:{password}@127.0.0.1:{port}/0")
    store = open_store(feast_project, tmp_path / "repo", online="redis")  # URL from the env
    store.apply(solaris_definitions().all())
    vectors = np.random.default_rng(3).standard_normal((4, DIM)).astype(np.float32)
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pair_frame(5, [0, 1, 2, 3], vectors)
    )
    retriever = SolarisRetriever(store, VERSION, deadline_ms=2000, record_misses=False)
    served = retriever.fetch(5, [0, 1, 2, 3])
    retriever.close()
    assert not served.error and (served.tiers == Tier.EXACT).all()
    np.testing.assert_array_equal(served.embeddings, vectors)

    # The port speaks nothing but TLS, and the certificate is verified, not just accepted.
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1).ping()
    monkeypatch.delenv("SSL_CERT_FILE")
    unverified = SolarisRetriever(store, VERSION, deadline_ms=2000, record_misses=False)
    assert unverified.fetch(5, [0]).error
    unverified.close()
    leaks = [
        p
        for p in (tmp_path / "repo").rglob("*")
        if p.is_file() and password.encode() in p.read_bytes()
    ]
    assert not leaks


def test_redis_password_reaches_no_file_and_no_log_line(
    feast_project: str,  # first: its teardown must see the real REDIS_URL again
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from feast import FeatureStore

    password = f"pw-{secrets.token_hex(12)}"
    repo = tmp_path / "repo"
    repo.mkdir()
    # The repo's Redis yaml, as a user would copy it: the connection is ${SOLARIS_REDIS_CONNECTION}.
    shutil.copy(REPO_ROOT / "feature_repo" / "feature_store.redis.yaml", repo)
    yaml_text = (repo / "feature_store.redis.yaml").read_text()
    caplog.set_level(logging.DEBUG)
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis") as server:
        redis.Redis(port=server.port).config_set("requirepass", password)
        monkeypatch.setenv("REDIS_URL", f"redis://:{password}@127.0.0.1:{server.port}/0")
        export_redis_connection()
        store = FeatureStore(repo_path=str(repo), fs_yaml_file=repo / "feature_store.redis.yaml")
        store.apply(solaris_definitions().all())
        writer = EmbeddingWriter(store, "solaris_pair", offline=True)
        vectors = np.ones((3, DIM), dtype=np.float32)
        writer.write(pair_frame(1, [1, 2, 3], vectors))
        writer.close()
        retriever = SolarisRetriever(store, VERSION, deadline_ms=500)
        assert (retriever.fetch(1, [1, 2, 3, 4]).tiers == [3, 3, 3, 0]).all()
        # Failures are logged: the log line names the failure, never the secret.
        redis.Redis(port=server.port, password=password).config_set("requirepass", password + "x")
        retriever.close()
        denied = SolarisRetriever(store, VERSION, deadline_ms=500, record_misses=False)
        assert denied.fetch(1, [1]).error
        denied.close()
        server.kill()
        down = retriever.fetch(1, [1, 2])
        assert down.error
        # A second store built in code from REDIS_URL writes no file with the secret either.
        coded = open_store(feast_project, tmp_path / "coded", online="redis")
        coded.apply(solaris_definitions().all())

    assert (repo / "feature_store.redis.yaml").read_text() == yaml_text
    leaks = [
        str(path)
        for path in [*repo.rglob("*"), *(tmp_path / "coded").rglob("*")]
        if path.is_file() and password.encode() in path.read_bytes()
    ]
    assert not leaks, f"the password was written to {leaks}"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("serving ZERO" in r.getMessage() for r in warnings), "failures must be logged"
    for record in caplog.records:
        assert password not in record.getMessage(), f"password logged by {record.name}"
        assert password not in str(record.args)
    out, err = capfd.readouterr()
    assert password not in out and password not in err


# -- model artifacts --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An FM, a compressor and a VM saved with their cards (untrained: only bytes matter)."""
    from solaris_feast.data.synthetic import SyntheticConfig, generate
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.registry import register_untrained_chain

    models = tmp_path_factory.mktemp("models")
    dataset = generate(SyntheticConfig(num_users=40, num_items=30, num_categories=4, days=1.0))
    schema = PairFeaturizer(dataset, history_len=4).schema
    register_untrained_chain(models, schema, ("click", "conversion"))
    return models


def fresh_copy(models: Path, tmp_path: Path) -> Path:
    target = tmp_path / "models"
    shutil.copytree(models, target)
    return target


def card_of(models: Path, kind: str) -> tuple[Path, dict[str, object]]:
    for path in sorted(models.glob("*.card.json")):
        card = json.loads(path.read_text())
        if card["kind"] == kind:
            return path, card
    raise LookupError(kind)


class _PickleBomb:
    """Unpickling this creates a directory: proof that something was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def test_untouched_artifacts_load(trained_models: Path, tmp_path: Path) -> None:
    from solaris_feast.models.registry import load_bundle

    bundle = load_bundle(fresh_copy(trained_models, tmp_path))
    assert bundle.embedding_version.startswith("compressor-")


@pytest.mark.parametrize("kind", ["fm", "compressor", "vm"])
def test_a_tampered_weights_file_is_refused_before_loading(
    trained_models: Path, tmp_path: Path, kind: str
) -> None:
    from solaris_feast.models.registry import load_bundle

    models = fresh_copy(trained_models, tmp_path)
    _, card = card_of(models, kind)
    weights = models / str(card["weights_file"])
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit inside the tensor data: still a valid safetensors file
    weights.write_bytes(bytes(raw))
    with pytest.raises(ArtifactIntegrityError, match="sha256"):
        load_bundle(models)


def test_weights_swapped_for_another_models_are_refused(
    trained_models: Path, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    from solaris_feast.models.compressor import EmbeddingCompressor
    from solaris_feast.models.registry import load_bundle

    models = fresh_copy(trained_models, tmp_path)
    _, card = card_of(models, "compressor")
    other = {k: v.contiguous() for k, v in EmbeddingCompressor().state_dict().items()}
    save_file(other, str(models / str(card["weights_file"])))  # same shapes, other values
    with pytest.raises(ArtifactIntegrityError):
        load_bundle(models)


def test_a_pickle_behind_a_matching_card_is_never_unpickled(
    trained_models: Path, tmp_path: Path
) -> None:
    """Even an attacker who rewrites the card's sha256 gets no code run: weights are read with
    safetensors, which parses a header and raw tensor bytes and has no code path to unpickle."""
    from solaris_feast.models.registry import load_bundle

    models = fresh_copy(trained_models, tmp_path)
    marker = tmp_path / "pickle-ran"
    card_path, card = card_of(models, "compressor")
    payload = pickle.dumps(_PickleBomb(marker))
    (models / str(card["weights_file"])).write_bytes(payload)
    card["weights_sha256"] = hashlib.sha256(payload).hexdigest()
    card_path.write_text(json.dumps(card))
    with pytest.raises(Exception) as refused:
        load_bundle(models)
    assert not isinstance(refused.value, ArtifactIntegrityError)  # the sha matched; parsing failed
    assert not marker.exists(), "the weights file was unpickled"


def test_online_values_are_parsed_never_unpickled(
    tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    from solaris_feast.store.layout import EntityKeyLayout, online_field

    store = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pair_frame(1, [1, 2], np.ones((2, DIM), dtype=np.float32))
    )
    marker = tmp_path / "pickle-ran"
    payload = pickle.dumps(_PickleBomb(marker))
    client = redis.Redis.from_url(redis_url)
    key = EntityKeyLayout(["user_id", "item_id"], 3).key(1, 2) + feast_project.encode()
    # Poison every field of one stored row; the other row stays intact.
    for feature in ("embedding", "model_version", "computed_at"):
        client.hset(key, online_field("solaris_pair", feature), payload)
    retriever = SolarisRetriever(store, VERSION, record_misses=False, deadline_ms=2000)
    result = retriever.fetch(1, [1, 2])
    retriever.close()
    assert not result.error
    assert result.tiers.tolist() == [Tier.EXACT, Tier.ZERO]
    assert not result.embeddings[1].any()
    assert not marker.exists()


UNSAFE_CALLS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("marshal", "loads"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
}


def test_no_code_path_unpickles_or_evaluates_stored_data() -> None:
    """A static scan of the package and the DAGs for calls that run code from bytes."""
    findings = []
    sources = [*(REPO_ROOT / "solaris_feast").rglob("*.py"), *(REPO_ROOT / "dags").rglob("*.py")]
    assert len(sources) > 10
    for path in sources:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
            keywords = {k.arg: k.value for k in node.keywords}
            # The one allowed exec compiles the resolved view's source text that definitions.py
            # has just generated from the config; it never reads it back from storage.
            if (
                isinstance(func, ast.Name)
                and func.id in ("eval", "exec")
                and not (func.id == "exec" and path.name == "definitions.py")
            ):
                findings.append(f"{where} {func.id}()")
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                call = (func.value.id, func.attr)
                if call in UNSAFE_CALLS:
                    findings.append(f"{where} {call[0]}.{call[1]}()")
                if call == ("torch", "load"):
                    safe = keywords.get("weights_only")
                    if not (isinstance(safe, ast.Constant) and safe.value is True):
                        findings.append(f"{where} torch.load without weights_only=True")
                if call == ("np", "load") or call == ("numpy", "load"):
                    allow = keywords.get("allow_pickle")
                    if isinstance(allow, ast.Constant) and allow.value is True:
                        findings.append(f"{where} np.load(allow_pickle=True)")
                if call[1] == "read_pickle":
                    findings.append(f"{where} read_pickle()")
    assert not findings, findings


def test_passwords_that_feasts_connection_string_would_take_apart_arrive_as_written(
    feast_project: str,  # first: its teardown must see the real REDIS_URL again
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Feast's connection string is split on "," and each value JSON-decoded, and the yaml it is
    expanded into reads " #" as a comment: a password with a comma lost its tail, ``1e3``
    arrived as 1000.0, so a deployment with such a password (valid in its REDIS_URL) could not
    log in. Read here through both parsers: Feast's own store and the retriever."""
    from urllib.parse import quote

    from feast import FeatureStore

    repo = tmp_path / "repo"
    repo.mkdir()
    yaml_text = (REPO_ROOT / "feature_repo" / "feature_store.redis.yaml").read_text()
    (repo / "feature_store.redis.yaml").write_text(
        yaml_text.replace("project: solaris", f"project: {feast_project}")
    )
    vectors = np.full((1, DIM), 0.5, dtype=np.float32)
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis") as server:
        admin = redis.Redis(port=server.port)
        for n, (user, password) in enumerate(
            [("comma", "ab,cd"), ("numeric", "1e3"), ("spaced", "a #b: c,$HOME")]
        ):
            admin.acl_setuser(
                user,
                enabled=True,
                passwords=[f"+{password}"],
                keys=["*"],
                channels=["*"],
                commands=["+@all"],
            )
            monkeypatch.setenv(
                "REDIS_URL", f"redis://{user}:{quote(password, safe='')}@127.0.0.1:{server.port}/3"
            )
            export_redis_connection()
            store = FeatureStore(
                repo_path=str(repo), fs_yaml_file=repo / "feature_store.redis.yaml"
            )
            if n == 0:
                store.apply(solaris_definitions().all())
            writer = EmbeddingWriter(store, "solaris_pair", offline=False)
            writer.write(pair_frame(n, [n], vectors))
            writer.close()
            feast_read = store.get_online_features(
                features=["solaris_pair:embedding"], entity_rows=[{"user_id": n, "item_id": n}]
            ).to_dict()
            assert np.allclose(feast_read["embedding"][0], vectors[0]), user
            retriever = SolarisRetriever(store, VERSION, deadline_ms=2000, record_misses=False)
            assert retriever.fetch(n, [n]).tiers.tolist() == [Tier.EXACT], user
            retriever.close()
        assert redis.Redis(port=server.port, db=3).dbsize() >= 3  # db 3, as the URL says


def test_a_refused_login_ends_a_command_with_one_line_naming_the_server(
    feast_project: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password (or a missing ACL permission, a full Redis) is final, not a bug: the
    command used to end in a 240-line traceback that never named the server."""
    repo = tmp_path / "repo"
    repo.mkdir()
    yaml_text = (REPO_ROOT / "feature_repo" / "feature_store.redis.yaml").read_text()
    (repo / "feature_store.redis.yaml").write_text(
        yaml_text.replace("project: solaris", f"project: {feast_project}")
    )
    password = f"pw-{secrets.token_hex(8)}"
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis") as server:
        redis.Redis(port=server.port).config_set("requirepass", password)
        monkeypatch.setenv("REDIS_URL", f"redis://:{password}@127.0.0.1:{server.port}/0")
        open_store(feast_project, repo, online="redis").apply(solaris_definitions().all())
        # Only this repo: no SOLARIS_* variable an earlier test left behind names another.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SOLARIS_")}
        env["REDIS_URL"] = f"redis://:wrong-{password}@127.0.0.1:{server.port}/0"
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "solaris"),
                "status",
                "--repo",
                str(repo),
                "--config",
                "feature_store.redis.yaml",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: AuthenticationError"), last
    assert f"Redis at 127.0.0.1:{server.port}" in last and "password" in last
    assert password not in proc.stderr and password not in proc.stdout
