"""The request path: the tier rule (``resolve``), the retriever that reads and resolves all tiers
in one round trip, and the queue of misses for the next round."""
