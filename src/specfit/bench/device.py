"""``python -m specfit.bench device``: the emulated device's cost model against the hardware it stands for.

Derives a GPU's parameters (:class:`specfit.engine.device.DeviceModel`) from the paper's AR and EAGLE-3 rows of one
workload (A100: summarization, Table 2; RTX 4090: GSM8K, Table 4), feeds the model the per-cycle counters of every
row of Tables 2-4 (nodes, drafted levels, expert union and copies per cycle), and prints its predicted ms per cycle
beside the paper's, with the error per cell. Then prints the toy's parameters (the one scaling rule,
:func:`specfit.engine.device.scaled`): the paper's own milliseconds, per-expert times times the experts of an AR token
on the paper's model over the toy's, the numbers config.yaml's emulated devices carry (``select_ms``, the host's
selection as specfit-ca prices it, is the CPU's and does not scale). ``--step-ms`` rescales the unit.
The counters and the derivation: `specfit.engine.paper_gpus` and docs/device.md.

Then, for each resident device of the config (config.yaml with ``--configfile`` overlays, by default
config.resident.yaml when it is there; none outside a workflow folder, said so), its
fit (`specfit.engine.resident`): a, b, c, the predicted vs measured ms per width with the error, and the toy's scaled
parameters (docs/devices.md).
"""

from __future__ import annotations

from pathlib import Path

from specfit import bench
from specfit.engine.device import HOST_PARAMETERS, PARAMETERS, scaled
from specfit.engine.paper_gpus import DERIVED_FROM, NAMES, check, derive
from specfit.engine.resident import fit
from specfit.paper import paper_results
from specfit.planning.config import add_configfile_option


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__, raw=True)
    parser.add_argument("--step-ms", type=float, default=None,
                        help="the toy's cached AR step on the A100 (ms; default: the paper's own, unit 1)")
    parser.add_argument("--experts-per-token", type=int, default=16, help="the toy's MoE layers x top-k")
    parser.add_argument("--top-k", type=int, default=4, help="the toy's experts per token (resident devices)")
    add_configfile_option(parser, "config.resident.yaml when it is there")
    args = parser.parse_args(argv)
    paper = paper_results()
    print("The device model fed the paper's per-cycle counters (Tables 2-4): predicted vs reported ms per cycle.")
    print("'fit': a row the parameters were derived from; '~': union or drafted levels estimated (see --help).")
    print(f"{'GPU':9s} {'workload':14s} {'method':8s} {'cache':9s} {'union':>7s} {'copies':>7s} "
          f"{'paper':>8s} {'model':>8s} {'error':>7s}")
    for r in check(paper):
        note = "fit" if r["fitted"] else ("~" if r["estimated"] else "")
        print(f"{NAMES[r['gpu']]:9s} {r['workload']:14s} {r['method']:8s} {r['mode']:9s} {r['union']:7.0f} "
              f"{r['copies']:7.0f} {r['paper_ms']:8.1f} {r['model_ms']:8.1f} {100 * r['error']:+6.1f}% {note}")
    worst = max(abs(r["error"]) for r in check(paper))
    print(f"largest error: {100 * worst:.1f}% (goal: within 10%)")
    reference = derive(paper, "a100")["ar_step_ms"]
    step_ms = reference if args.step_ms is None else args.step_ms
    print(f"\nParameters (ms); the toy's: one unit for every GPU, {step_ms:g} ms per {reference} ms of the A100's "
          f"cached AR step, per-expert times also x 384 / {args.experts_per_token} (the experts of an AR token):")
    for gpu in DERIVED_FROM:
        params = derive(paper, gpu)
        print(f"  {NAMES[gpu]} (from its {DERIVED_FROM[gpu]} AR and EAGLE-3 rows): "
              + ", ".join(f"{k} {params[k]:.4g}" for k in PARAMETERS + HOST_PARAMETERS)
              + f"; cached AR step {params['ar_step_ms']}")
        toy = scaled(params, reference, step_ms, args.experts_per_token)
        print("    toy: emulate: {" + ", ".join(
            f"{k}: {v}" if k == "name" else f"{k}: {v:.4g}" for k, v in toy.items()) + "}")
    print_resident(resident_devices(args.configfile), args.experts_per_token, args.top_k)


def resident_devices(overlays: list[str] | None) -> dict[str, dict]:
    """The config's resident devices by name (config.yaml and its overlays in the working directory; none without
    a config.yaml there)."""
    if overlays is None:
        overlays = ["config.resident.yaml"] if Path("config.resident.yaml").is_file() else []
    found = {}
    if Path("config.yaml").is_file():
        from specfit.planning.config import SCHEMA, load_config

        config = load_config("config.yaml", SCHEMA, *overlays, check_files=False)
        found = {name: dev["resident"] for name, dev in config["devices"].items() if dev.get("resident") is not None}
    return found


def print_resident(devices: dict[str, dict], experts_per_token: int, top_k: int) -> None:
    """Each resident device's fit, per-width predicted vs measured, and the toy's scaled parameters."""
    layers = experts_per_token // top_k
    if not devices:
        print("\nNo resident device: run from the workflow's folder, where config.resident.yaml defines them.")
    for name, spec in devices.items():
        device = fit(spec, f"devices.{name}.resident")
        print(f"\nResident device {name} ({device.name}, {device.gather} gather; L {device.moe_layers}, "
              f"N {device.experts}, k {device.experts_per_token}): cost(w) = a + b*[w > 1] + c*R(w)")
        print(f"  a {device.a:.4g} ms, b {device.b:.4g} ms, c {device.c:.4g} ms per expert read; "
              f"drafted level {device.draft_ms:.4g} ms ({device.draft_share:g} of the width-1 step, assumed)")
        print(f"  {'width':>5s} {'reads':>8s} {'measured':>9s} {'fit':>8s} {'error':>7s}")
        for w, ms, predicted, reads, error in zip(device.widths, device.ms, device.predicted(device.widths),
                                                  device.reads(device.widths), device.errors()):
            print(f"  {w:5d} {reads:8.1f} {ms:9.2f} {predicted:8.2f} {100 * error:+6.1f}%")
        worst = max(abs(device.errors()))
        print(f"  largest error: {100 * worst:.1f}% (goal: within 10%)")
        toy = device.for_toy(layers, top_k)
        print(f"  toy ({layers} MoE layers x top-{top_k}: one toy read stands for "
              f"{device.moe_layers * device.experts_per_token / (layers * top_k):.4g}): fixed {toy.a:.4g} ms, "
              f"+{toy.b:.4g} ms over one token, read_ms {toy.read_ms:.4g}, draft_ms {toy.draft_ms:.4g}, copies 0")

if __name__ == "__main__":
    main()
