"""The Airflow task bodies that ``dags/`` call, split by job.

``settings`` (the pydantic settings and the DAG params generated from them; light, imported at
parse time), ``runs`` (run time, run folders, written-once files), ``log`` (the log as a run sees
it), ``training`` (the training DAG's stages), ``precompute`` and ``coverage`` (the precompute
DAG's tasks) and ``failures`` (final errors fail a task at once, retryable ones retry).
"""
