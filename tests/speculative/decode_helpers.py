"""Decoding a list of prompts with one method, for the method tests of this folder."""

from specfit.speculative.request import decode_request


def decode_prompts(model, drafter, method, prompts, limits, engine, reference=None, clear_cache=False):
    """Each prompt decoded in turn (request ids 0, 1, ...); with ``reference`` (AR's outputs) the oracle drafter
    follows prompt + that output; ``clear_cache`` empties the engine's cache before every request, else the
    requests share it, as a decode run's do."""
    out = []
    for i, prompt in enumerate(prompts):
        if reference is not None:
            drafter.sequence = prompt + reference[i]
        if clear_cache and engine is not None:
            engine.clear_cache()
        out.append(decode_request(model, drafter, method, prompt, request_id=i, question_id=i, limits=limits,
                                  engine=engine))
    return out
