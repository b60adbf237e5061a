"""The Airflow task bodies that ``dags/`` call, split by job.

``settings`` (the pydantic settings, the DAG params generated from them and the tasks' time
limits and retries; light, imported at parse time), ``runs`` (run time, run folders,
written-once files, a round's place on its cron), ``log`` (the log as a run sees it),
``training`` (the training DAG's stages), ``precompute`` and ``coverage`` (the precompute DAG's
tasks), ``registry_snapshot`` (what a round knows of its registry without Feast), ``promotion``
(naming the serving chain), ``assets`` (the Airflow assets between the DAGs) and ``failures``
(final errors fail a task at once, retryable ones retry).
"""
