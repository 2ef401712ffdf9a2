"""The ``specfit`` console script: ``specfit generate``, a thin shell over `specfit.api.Decoder`.

Run from the workflow root (it reads ``config.yaml`` there, and the workflow's outputs for the model and device)::

    specfit generate --model toy --device cpu-a100link --method specfit-learned "Summarize: ..."
    echo "What is 12 * 7?" | specfit generate --model toy --device cpu-a100 --method eagle3 --compare ar --json

The text streams to stdout as cycles commit it and a summary goes to stderr; ``--json`` prints one record instead.
Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from specfit.errors import SpecFitError
from specfit.planning.config import add_configfile_option
from specfit.speculative.kinds import AR
from specfit.speculative.sampling import MODES, Sampling


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specfit", description="SpecFit's decoder on the workflow's models and devices")
    commands = p.add_subparsers(dest="command", required=True)
    g = commands.add_parser("generate", help="decode one prompt, greedy or sampled, with a deployable method",
                            description="Decode one prompt (an argument, or stdin) in the model's chat template.")
    g.add_argument("prompt", nargs="?", help="the prompt (read from stdin when omitted)")
    add_configfile_option(g)
    g.add_argument("--model", help="a model of the config (models.<name>)")
    g.add_argument("--device", help="a device of the config (devices.<name>)")
    g.add_argument("--method", help="a deployable method of the config (methods.<name>)")
    g.add_argument("--routes", choices=["learned"], help="run a SpecFit method on the trained route predictor")
    g.add_argument("--slots", type=int, help="expert slots per layer (default: the model's main_slots on the device)")
    g.add_argument("--max-new-tokens", type=int, default=None, help="output tokens at most (default 128)")
    g.add_argument("--compare", choices=[AR.name], help="decode with AR too: identical output? speedup?")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling at T > 0, in (0, 1] (default 1)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the top k tokens at T > 0 (default 0: all)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampling noise (default 0)")
    g.add_argument("--sampling", choices=list(MODES), default="coupled",
                   help="at T > 0: coupled (AR's tokens at the seed, the default) or rejection (EAGLE's rejection "
                        "sampling: AR's distribution, not its tokens)")
    g.add_argument("--json", action="store_true", help="print one JSON record instead of the text and summary")
    g.add_argument("--threads", type=int, default=1,
                   help="torch's CPU threads (1, as Snakemake runs each decode job: an idle wait on a busy core "
                        "cannot stall a forward)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    try:
        generate(args)
    except SpecFitError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


def generate(args: argparse.Namespace) -> None:
    import torch
    from transformers.utils import logging as transformers_logging  # torch: loaded once the arguments are read

    from specfit.api import MAX_NEW_TOKENS, Decoder, compare

    if args.threads < 1:
        raise SpecFitError(f"--threads must be at least 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    transformers_logging.disable_progress_bar()  # stderr holds the summary

    # from stdin without the newline `echo` ends it with, so that both ways give one prompt
    prompt = args.prompt if args.prompt is not None else ("" if sys.stdin.isatty() else sys.stdin.read().rstrip("\n"))
    if not prompt.strip():
        raise SpecFitError("no prompt: give it as an argument or on stdin")
    sampling = sampling_keys(args)
    decoder = Decoder.from_config(
        args.model, args.device, args.method, overlays=args.configfile or [], slots=args.slots, routes=args.routes,
        max_new_tokens=MAX_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens, sampling=sampling,
    )
    if args.json or args.compare:
        ours, ar = compare(decoder, prompt) if args.compare else (decoder.generate(prompt), None)
        if not args.json:
            print(ours.text, flush=True)
    else:
        pieces = decoder.stream(prompt)
        while True:
            try:
                sys.stdout.write(next(pieces))
                sys.stdout.flush()
            except StopIteration as done:
                ours, ar = done.value, None
                break
        print(flush=True)
    record = {**ours.figures, "text": ours.text, "prompt_ids": ours.prompt_ids, "output_ids": ours.output_ids}
    if ar is not None:
        record["compare"] = {"method": AR.name, "identical": ar.output_ids == ours.output_ids,
                             "guarantee": guarantee(ours.figures["sampling"]),
                             "tps_dec": ar.figures["tps_dec"], "speedup": speedup(ours, ar)}
    if args.json:
        print(json.dumps(record))
    else:
        print(summary(record), file=sys.stderr)


FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed",
         "sampling": "--sampling"}


def sampling_keys(args: argparse.Namespace) -> dict:
    """The sampling flags as `specfit.api.Decoder.from_config` takes them, refused here naming the flag."""
    keys = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
            "sampling": args.sampling}
    try:
        Sampling.of(keys)
    except SpecFitError as err:
        key = next(k for k in FLAGS if str(err).startswith(k))
        raise SpecFitError(f"{FLAGS[key]}: {err}") from None
    return keys


def guarantee(sampling: dict) -> str:
    """What `--compare ar` may expect: AR's tokens (greedy, coupled sampling) or only AR's distribution."""
    return Sampling.of(sampling).guarantee


def speedup(ours, ar) -> float | None:
    a, b = ours.figures["tps_dec"], ar.figures["tps_dec"]
    return a / b if a and b else None


def summary(r: dict) -> str:
    """The record in a few lines for a person."""

    def num(x, fmt=".2f"):
        return "n/a" if x is None else format(x, fmt)

    routes = f" ({r['routes']} routes)" if r["routes"] else ""
    lines = [
        f"{r['method']}{routes} on {r['model']}, {r['device']} "
        f"({r['slots']} slots): {r['n_output_tokens']} tokens, "
        f"{num(r['tps_dec'], '.1f')} tokens/s decode [{r['timing_label']}]",
        f"per cycle: {num(r['committed_per_cycle'])} committed tokens, {num(r['draft_nodes_per_cycle'])} verified "
        f"draft nodes, {num(r['select_ms_per_cycle'], '.3f')} ms selection; {num(r['h2d_per_token'])} expert copies "
        "per token",
    ]
    if "compare" in r:
        c = r["compare"]
        if c["guarantee"] == "distribution":  # rejection sampling: identity is not promised, so never claimed
            same = "tokens may differ (rejection sampling keeps AR's distribution, not its tokens)"
        else:
            same = "identical output" if c["identical"] else "OUTPUT DIFFERS"
        lines.append(f"ar: {same}, {num(c['tps_dec'], '.1f')} tokens/s decode; speedup {num(c['speedup'])}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
