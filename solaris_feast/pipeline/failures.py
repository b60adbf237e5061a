"""Final errors fail an Airflow task at once; retryable ones are left to the task's retries.

A precompute against a repo whose views were never applied used to retry for minutes and end in
the same error; no retry can fix it. :func:`fail_fast_on_final_errors` wraps a task's callable:
an exception that :func:`solaris_feast.errors.is_retryable` accepts (a store that is down, slow,
busy or locked) propagates unchanged, so Airflow retries it with the DAG's ``retries`` and
``retry_delay``; any other exception is re-raised as Airflow's ``AirflowFailException``, which
ends the task on this try, its message naming the original error.

Cost: imports nothing heavy (Airflow's exception class only when an error is translated), so the
DAG files can apply it at parse time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from solaris_feast.errors import describe_error, is_retryable

logger = logging.getLogger(__name__)

TASK_QUIET_LOGGERS = ("feast", "faiss")
"""Libraries whose INFO lines ("Registry cache expired, so refreshing", faiss's loader) fill a
task's log several times per task; their warnings and errors still show. Airflow's own lines
stay: they are the task log."""

P = ParamSpec("P")
R = TypeVar("R")


def fail_fast_on_final_errors(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, with its final errors raised as ``AirflowFailException`` (no retry), and
    the chatter of :data:`TASK_QUIET_LOGGERS` kept out of its task log."""

    @functools.wraps(function)
    def task_body(*args: P.args, **kwargs: P.kwargs) -> R:
        for name in TASK_QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            if is_retryable(exc):
                logger.warning("%s: retryable %s", function.__name__, describe_error(exc))
                raise
            from airflow.sdk.exceptions import AirflowException, AirflowFailException

            if isinstance(exc, AirflowException):
                raise  # Airflow's own signals (skip, reschedule, fail) keep their meaning
            logger.error("%s: final, not retried: %s", function.__name__, describe_error(exc))
            raise AirflowFailException(describe_error(exc)) from exc

    return task_body
