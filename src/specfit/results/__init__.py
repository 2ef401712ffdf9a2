"""What a run records and how it is summarised: the Parquet schemas of prompts, requests, cycles and atlases
(`records`), a decode run's metrics (`metrics`, with the n-gram repetition measures of `ngrams`; a stream's whole
metrics.json with the engine's counters and the lossless check: `summary`) and the bootstrap intervals every
throughput and ratio carries (`intervals`).
"""
