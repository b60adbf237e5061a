"""Loopback ports of the servers this suite starts itself, all from one base, so that two runs
of the suite on one machine (a developer's and CI's, or parallel sessions) do not take each
other's ports.

``SOLARIS_TEST_PORT_BASE`` sets the base. By default it is the first block of :data:`BLOCK`
ports from 17000 (in steps of :data:`BLOCK`) of which every port this suite uses is free when
the suite starts.
"""

from __future__ import annotations

import os
import socket

from solaris_feast.bench import loopback_port_is_free

BLOCK = 300
"""Ports per block; every offset below is under it."""

# Offsets inside the block.
_PROXY = 0  # the cutting proxy of the hardening tests
_CLUSTER = (1, 2, 3)  # a Redis Cluster of three primaries (test_hardening_cluster)
_THROWAWAY = 5  # a redis-server a test may kill (test_hardening_faults, _fuzz)
_TLS = 6  # a TLS-only redis-server (test_hardening_security)
_FAILOVER = (200, 201, 202, 203, 204, 205)  # cluster with replicas (test_cluster_failover)
_FAILOVER_PROXY = 210
_CELERY_API = 230  # the Airflow API server of test_celery
_FEAST_SERVING_REDIS = 290  # the throwaway Redis of test_feast_serving
_CLAIM = 299  # bound for the whole run, so that a second run skips this block
FAILOVER_BUS_OFFSET = 50
"""A failover node's cluster bus is its port + this (Redis's default, + 10000, leaves the
block)."""

_ALL = (
    _PROXY,
    *_CLUSTER,
    _THROWAWAY,
    _TLS,
    *_FAILOVER,
    *(p + FAILOVER_BUS_OFFSET for p in _FAILOVER),
    _FAILOVER_PROXY,
    _CELERY_API,
    _FEAST_SERVING_REDIS,
)


_claim: socket.socket | None = None


def _claimed(base: int) -> bool:
    """Bind the block's claim port for the rest of this process. Most of the block's servers
    run only during their own test, so a run that started while another's were down would
    otherwise take the same block and the two would meet mid-run (seen as setup errors of the
    failover cluster)."""
    global _claim
    claim = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        claim.bind(("127.0.0.1", base + _CLAIM))
    except OSError:
        claim.close()
        return False
    _claim = claim
    return True


def _base() -> int:
    if os.environ.get("SOLARIS_TEST_PORT_BASE"):
        return int(os.environ["SOLARIS_TEST_PORT_BASE"])
    for base in range(17000, 30000, BLOCK):
        if all(loopback_port_is_free(base + offset) for offset in _ALL) and _claimed(base):
            return base
    raise RuntimeError(
        "no block of free loopback ports from 17000 to 30000: set SOLARIS_TEST_PORT_BASE"
    )


BASE = _base()
PROXY_PORT = BASE + _PROXY
CLUSTER_PORTS = tuple(BASE + p for p in _CLUSTER)
THROWAWAY_PORT = BASE + _THROWAWAY
TLS_PORT = BASE + _TLS
FAILOVER_PORTS = tuple(BASE + p for p in _FAILOVER)
FAILOVER_PROXY_PORT = BASE + _FAILOVER_PROXY
CELERY_API_PORT = BASE + _CELERY_API
FEAST_SERVING_REDIS_PORT = BASE + _FEAST_SERVING_REDIS
