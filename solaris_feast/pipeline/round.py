"""One precompute round in this process: the precompute DAG's tasks, in the DAG's order.

What ``solaris precompute`` and ``solaris demo`` run; the DAG (``dags/solaris_precompute.py``)
runs the same task bodies as Airflow tasks, the shards as mapped tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def precompute_round(
    settings: Mapping[str, Any],
    interval: Mapping[str, Any],
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """start -> drain -> rank each shard -> split the budget -> FM each shard -> aggregate ->
    fill -> coverage. Returns the run spec and every step's report; ``echo`` gets one line per
    step."""
    from solaris_feast.pipeline import coverage, precompute

    say = echo or (lambda _line: None)
    run = precompute.start_precompute(settings, interval)
    say(f"round {run['interval_key']} at {run['now']} with VM {run['vm_version']}")
    misses = precompute.drain_miss_queue(run)
    say(f"misses      {misses['misses']} taken from the queue")
    rankings = [precompute.rank_shard(run, shard) for shard in range(run["settings"]["shards"])]
    strangers = sum(r.get("stranger_candidates", 0) for r in rankings)
    say(
        f"candidates  {sum(r['candidates'] for r in rankings)} pairs in {len(rankings)} "
        f"shard(s), {sum(r['eligible'] for r in rankings)} not fresh"
        + (
            f", {strangers} of users or items the FM never saw left to the fallback tiers"
            if strangers
            else ""
        )
    )
    split = precompute.split_round_budget(run)
    say(f"plan        {split['planned']} pairs for the FM, per shard {split['budgets']}")
    shards = [precompute.precompute_shard(run, shard) for shard in split["shard_indexes"]]
    for report in shards:
        say(f"shard {report['shard']}     {report.get('pairs', 0)} pairs")
    users = precompute.aggregate_users(run)
    say(f"aggregates  {users['users']} users, {users['written']} changed")
    filled = precompute.fill_similar(run)
    say(f"similar     {filled['filled']} pairs filled")
    covered = coverage.publish_coverage(run)
    return {
        "run": run,
        "misses": misses,
        "rankings": rankings,
        "plan": split,
        "shards": shards,
        "users": users,
        "filled": filled,
        "coverage": covered,
    }


def run_task(task: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """The body of one precompute DAG task by its task id (``rank_shard[1]`` for a mapped one),
    for running a task in its own process as an executor would (the benchmarks do).

    ``state``: ``settings`` and ``interval`` for ``start``; ``run`` (start's report) for the rest.
    """
    from solaris_feast.pipeline import coverage, precompute

    name, _, index = task.partition("[")
    if name == "start":
        return precompute.start_precompute(state["settings"], state["interval"])
    run = state["run"]
    if name == "rank_shard":
        return precompute.rank_shard(run, int(index.rstrip("]")))
    if name == "precompute_shard":
        return precompute.precompute_shard(run, int(index.rstrip("]")))
    bodies = {
        "drain_miss_queue": precompute.drain_miss_queue,
        "split_budget": precompute.split_round_budget,
        "aggregate_users": precompute.aggregate_users,
        "fill_similar": precompute.fill_similar,
        "publish_coverage": coverage.publish_coverage,
    }
    if name not in bodies:
        raise ValueError(f"no precompute task {task!r}; tasks: start, rank_shard[i], ...")
    return bodies[name](run)
