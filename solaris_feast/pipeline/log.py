"""The interaction log as a run sees it: the recorded log, aligned to the run's time."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from solaris_feast.data.schema import InteractionDataset
    from solaris_feast.pipeline.settings import LogSource


def load_log(source: LogSource, now: datetime, window_seconds: float = 0.0) -> InteractionDataset:
    """The interaction log strictly before ``now`` (aligned to ``now`` when asked).

    A user's log (``source.log``) is read from ``now - window_seconds - log.history_seconds``
    only, with a pyarrow filter (:func:`solaris_feast.data.log_source.read_log_window`): a
    round's work needs ``window_seconds`` of events (0 for a precompute round, the training
    window for training) and each event needs its user's history before it.
    """
    import pandas as pd

    from solaris_feast.data.schema import EVENT_TIMESTAMP

    if source.log is not None:
        from solaris_feast.data.log_source import read_log_window

        start = pd.Timestamp(now) - pd.Timedelta(
            seconds=window_seconds + source.log.history_seconds
        )
        return read_log_window(source.log, start.to_pydatetime(), now)
    dataset = aligned_log(source, now)
    log = dataset.interactions
    log = log.loc[log[EVENT_TIMESTAMP] < pd.Timestamp(now)].reset_index(drop=True)
    return dataset.with_interactions(log)


def aligned_log(source: LogSource, now: datetime) -> InteractionDataset:
    """The whole recorded log, shifted so that its held-out tail starts at ``now``.

    With ``holdout_fraction`` 0 its newest event lies one second before ``now``; otherwise the
    first held-out event lies at or after ``now``, and the held-out impressions are the future a
    replay serves.
    """
    import pandas as pd

    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.data.schema import EVENT_TIMESTAMP

    dataset = load_dataset(source.dataset, source.dataset_size, source.dataset_seed)
    log = dataset.interactions
    if not source.align_log_to_run or log.empty:
        return dataset
    ts = log[EVENT_TIMESTAMP]
    at = pd.Timestamp(now)
    if source.holdout_fraction > 0:
        cut = ts.min() + (ts.max() - ts.min()) * (1.0 - source.holdout_fraction)
        past_end = ts[ts < cut].max()
    else:
        past_end = ts.max()
    # Newest past event one second before `now`; whole seconds keep the shift exact.
    shift = (at - pd.Timedelta(seconds=1) - past_end).floor("s")
    return dataset.with_interactions(log.assign(**{EVENT_TIMESTAMP: ts + shift}))
