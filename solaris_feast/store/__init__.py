"""Where embeddings are kept: the Feast definitions, how Feast lays values out online, the store
backends (one module each, behind one contract), the writer and the offline rows."""
