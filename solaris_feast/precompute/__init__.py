"""The background job, in the order it runs: candidates -> plan (the verifier under a budget) ->
compute (FM -> compressor per planned pair) -> aggregate (24 h user means) -> similarity (faiss
neighbours' embeddings for the same item)."""
