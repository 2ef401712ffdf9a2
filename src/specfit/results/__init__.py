"""What a run records and how it is summarised: the Parquet schemas of prompts, requests, cycles and atlases
(`records`), a decode run's metrics (`metrics`, with the n-gram repetition measures of `ngrams`) and the bootstrap
intervals every throughput and ratio carries (`intervals`).
"""
