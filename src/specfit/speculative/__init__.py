"""Speculative decoding on the offloaded target, one request at a time (batch size 1, greedy).

- `config`: a method's parameters and the route sources, learned ones included (torch-free)
- `cycle`: what a method sees of the cycle it decides in; the request's stopwatch
- `draft`: the drafter's state and the candidate pool drafted level by level
- `tree`: tree attention masks, positions and KV-cache pruning
- `verify`: the target side: its causal and tree forwards, the route query, greedy acceptance
- `kinds`: the method kinds, each declaring once what the workflow and the report ask of it (torch-free)
- `methods`: the methods (AR, EAGLE-3, SpecFit; specfit-ca, beyond the paper, with the cache-aware cost) and
  `build_method`
- `prefetching`: the methods that prefetch experts while they draft (beyond the paper)
- `routes`: SpecFit's route sources (live target queries, the atlas, a noisy predictor) and `route_source_for`
- `learned`: learned routes (beyond the paper): the route predictor and the source that predicts with it
- `request`: one request's decoding: `Session` (prefill, draft, verify, commit) and `decode_request`
- `loading`: a stream's target, engine, method and drafter (`load`), its warm-up and reset (`Loaded`)
- `stream`: a method's timed request stream, resumable (what the decode and atlas stages run); its metrics are
  `specfit.results.summary`'s

Import from the submodules; this package imports nothing, so a stage depends only on what it uses.
"""
