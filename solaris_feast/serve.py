"""Kept so that ``from solaris_feast.serve import SolarisRetriever`` (the README before 0.2)
still works; the retriever lives in :mod:`solaris_feast.serving.retriever`."""

from solaris_feast.serving.retriever import FetchResult, RetrieverStats, SolarisRetriever

__all__ = ["FetchResult", "RetrieverStats", "SolarisRetriever"]
