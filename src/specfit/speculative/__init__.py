"""Speculative decoding on the offloaded target, one request at a time (batch size 1, greedy): a method's
parameters and the route sources, learned ones included (`config`, torch-free); what a method sees of the cycle it
decides in and the request's stopwatch (`cycle`); the drafter's state and the candidate pool drafted level by level
(`draft`); tree attention masks, positions and KV-cache pruning (`tree`); the target side, prefill, tree verification
and greedy acceptance (`verify`); the registered methods (AR, EAGLE-3, SpecFit; specfit-ca, beyond the paper, with
the cache-aware cost) and `build_method` (`methods`); SpecFit's route sources, live target queries, the atlas or a
noisy predictor, and `route_source_for` (`routes`); learned routes, beyond the paper (`learned`); one request's
decoding, `Session` and `decode_request` (`request`); and a method's timed request stream, resumable, which the decode
and atlas stages run (`stream`). Import from the submodules: this package imports nothing, so a stage depends only on
what it uses."""
