"""Speculative decoding on the offloaded target, one request at a time (batch size 1, greedy): a method's parameters and
the route sources, learned ones included (`config`, torch-free); the method kinds, each declaring once what the
workflow and the report ask of it (`kinds`, torch-free); what a method sees of the cycle it decides in and the
request's stopwatch (`cycle`); the drafter's state and the candidate pool drafted level by level (`draft`); tree
attention masks, positions and KV-cache pruning (`tree`); the target side, its causal and tree forwards, the route
query and greedy acceptance (`verify`); the exact verify, every tree row computed as AR's one-row step (`exact`); the
methods (AR, EAGLE-3, SpecFit; specfit-ca, beyond the paper, with the cache-aware cost) and `build_method` (`methods`);
the methods that prefetch experts while they draft, beyond the paper (`prefetching`); SpecFit's route sources, live
target queries, the atlas or a noisy predictor, and `route_source_for` (`routes`); learned routes, beyond the paper
(`learned`); one request's decoding, `Session` (prefill, draft, verify, commit) and `decode_request` (`request`); a
stream's target, engine, method and drafter and its warm-up (`loading`); and a method's timed request stream,
resumable, which the decode and atlas stages run (`stream`; its metrics are `specfit.results.summary`'s). Import from
the submodules: this package imports nothing, so a stage depends only on what it uses."""
