import pyarrow as pa
import pytest

from specfit.errors import SpecFitError
from specfit.io import write_json, write_parquet
from specfit.planning.config import SCHEMA, load_config, validate_config
from specfit.planning.matrix import decode_inputs, decode_runs, method_kind
from specfit.results.records import ATLAS_SCHEMA
from specfit.speculative.config import MethodConfig
from specfit.speculative.methods import SpecFit, build_method
from specfit.speculative.request import decode_request
from specfit.speculative.routes import AtlasRoutes, LiveRoutes

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]  # intercepts b_0..b_7
BETA = 0.05


def decode_all(target, drafter, method, prompts, limits, reference=None):
    results = []
    for i, prompt in enumerate(prompts):
        if reference is not None:  # the oracle drafter reads the AR continuation
            drafter.sequence = prompt + reference[i]
        result = decode_request(target, drafter, method, prompt, request_id=i, question_id=100 + i, limits=limits)
        results.append(result)
    return results


def outputs(results):
    return [r.request["output_ids"] for r in results]


def specfit(routes):
    return SpecFit(MethodConfig("specfit"), B, BETA, routes, num_experts=8)


@pytest.fixture(scope="module")
def ar_outputs(target, prompts, limits):
    return outputs(decode_all(target, None, build_method({"name": "ar"}), prompts, limits))


def check_records(results, limits, prompts):
    for r, prompt in zip(results, prompts):
        req = r.request
        room = min(limits.max_new_tokens, limits.limit_tokens - len(prompt))
        assert req["n_output"] == len(req["output_ids"]) == room  # random tokens: EOS is unlikely
        assert sum(c["committed"] for c in r.cycles) == req["n_output"] - 1
        assert [c["cycle"] for c in r.cycles] == list(range(len(r.cycles)))
        assert req["t_request_s"] >= req["t_prefill_s"] + sum(c["t_verify_s"] for c in r.cycles)
        for c in r.cycles:
            assert c["committed"] == c["accepted"] + 1 or c is r.cycles[-1]
            assert set(c["accepted_path"]) <= set(c["selected"])


def test_ar_is_one_token_per_cycle(target, prompts, limits, ar_outputs):
    ar = decode_all(target, None, build_method({"name": "ar"}), prompts, limits)
    assert outputs(ar) == ar_outputs
    check_records(ar, limits, prompts)
    for r in ar:
        assert all(c["pool_token"][1:] == [] and c["committed"] == 1 and c["selected"] == [] for c in r.cycles)


def test_random_drafter_is_lossless(target, drafter, prompts, limits, ar_outputs):
    eagle = decode_all(target, drafter, build_method({"name": "eagle3"}), prompts, limits)
    fit = decode_all(target, drafter, specfit(LiveRoutes()), prompts, limits)
    assert outputs(eagle) == ar_outputs
    assert outputs(fit) == ar_outputs
    check_records(eagle + fit, limits, prompts + prompts)
    for c in (c for r in eagle for c in r.cycles):
        n = len(c["pool_token"]) - 1
        assert len(c["selected"]) == min(7, n) and c["drafted_levels"] == max(c["pool_level"])


def test_oracle_drafter_accepts_and_is_lossless(target, oracle, prompts, limits, ar_outputs):
    eagle = decode_all(target, oracle, build_method({"name": "eagle3"}), prompts, limits, ar_outputs)
    live = LiveRoutes()
    fit = decode_all(target, oracle, specfit(live), prompts, limits, ar_outputs)
    assert outputs(eagle) == ar_outputs
    assert outputs(fit) == ar_outputs
    check_records(eagle + fit, limits, prompts + prompts)
    first = eagle[0].cycles[0]
    assert first["accepted"] == 5 and first["committed"] == 6  # the whole main path, then the next root
    assert all(c["accepted"] == min(5, max(c["pool_level"])) for r in eagle for c in r.cycles)
    assert sum(c["accepted"] for r in fit for c in r.cycles) > 0
    # one route query per cycle that drafted a pool
    assert len(live.rows) == sum(1 for r in fit for c in r.cycles if len(c["pool_token"]) > 1)


def test_atlas_replays_the_live_build(target, oracle, prompts, limits, ar_outputs, tmp_path):
    live = LiveRoutes()
    built = decode_all(target, oracle, specfit(live), prompts, limits, ar_outputs)
    path = tmp_path / "atlas.parquet"
    write_parquet(pa.Table.from_pylist(live.rows, schema=ATLAS_SCHEMA), path)
    measured = decode_all(target, oracle, specfit(AtlasRoutes(path)), prompts, limits, ar_outputs)
    assert outputs(measured) == ar_outputs
    for b, m in zip(built, measured):
        for cb, cm in zip(b.cycles, m.cycles, strict=True):
            assert cm["selected"] == cb["selected"] and cm["drafted_levels"] == cb["drafted_levels"]
            assert max(cm["pool_level"]) == cm["drafted_levels"]  # drafting stopped where the replay did
            n = len(cm["pool_token"])
            assert cm["pool_token"] == cb["pool_token"][:n] and cm["pool_prob"] == pytest.approx(cb["pool_prob"][:n])
    levels = [c["drafted_levels"] for r in measured for c in r.cycles]
    assert min(levels) < max(levels)  # the rule stops early in some cycles and not in others


CHAIN_METHOD = '''
from specfit.speculative.methods import Decision, Method, register_method


@register_method("greedy-chain")
class GreedyChain(Method):
    """Verify the most probable chain only: after each level, the best child of the last chosen node."""

    def select(self, cycle, pool, final):
        if not final:
            return None
        chain, node = [], 0
        while True:
            children = [v for v in range(1, pool.n + 1) if pool.parent[v] == node]
            if not children:
                return Decision(tuple(chain), pool.depth)
            node = max(children, key=lambda v: (pool.path_prob[v], -v))
            chain.append(node)
'''


def test_a_new_method_is_one_module(target, oracle, prompts, limits, ar_outputs, tmp_path, monkeypatch):
    """A method in a module of its own, named `module:name` in the config, is imported, registered and lossless."""
    (tmp_path / "chain_method.py").write_text(CHAIN_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    method = build_method({"name": "chain_method:greedy-chain"})
    chain = decode_all(target, oracle, method, prompts, limits, ar_outputs)
    assert outputs(chain) == ar_outputs
    assert all(len(c["selected"]) == max(c["pool_level"]) for r in chain for c in r.cycles)
    assert sum(c["accepted"] for r in chain for c in r.cycles) > 0
    with pytest.raises(SpecFitError, match="cannot import 'no_such_module'"):
        build_method({"name": "no_such_module:x"})


ROUTED_METHOD = '''
from specfit.speculative.methods import SpecFit, register_method


@register_method("full-depth", reads_routes=True)
class FullDepth(SpecFit):
    """Eq. 5 over the full pool: SpecFit's selection without its adaptive depth."""

    def draft_on(self, view, chosen, depth):
        return True
'''


def test_a_new_method_that_reads_routes_is_one_module(root, target, oracle, prompts, limits, ar_outputs, tmp_path,
                                                      monkeypatch):
    """A kind of one's own that reads routes: the plan gives its runs coefficients and an atlas, the atlas build
    with live routes writes the atlas its measured run replays, and both are lossless."""
    (tmp_path / "routed_method.py").write_text(ROUTED_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "routed_method:full-depth"

    config = load_config(root / "config.yaml", root / SCHEMA, check_files=False)
    config["methods"]["mine"] = {"kind": name, "routes": "atlas"}
    config["runs"][0]["methods"].append("mine")
    validate_config(config, root / SCHEMA, None)
    run = next(r for r in decode_runs(config) if r.method == "mine")
    assert method_kind(config, "mine").reads_routes
    assert {"coefficients", "atlas", "drafter"} <= set(decode_inputs(config, run))

    coefficients = tmp_path / "coefficients.json"
    write_json({"b": B, "beta": BETA}, coefficients)
    built = build_method({"name": name, "routes": "live"}, {"coefficients": coefficients}, num_experts=8)
    assert built.live is not None and built.drafts
    live = decode_all(target, oracle, built, prompts, limits, ar_outputs)
    assert outputs(live) == ar_outputs
    assert all(c["drafted_levels"] == max(c["pool_level"]) for r in live for c in r.cycles)  # no adaptive depth
    atlas = tmp_path / "atlas.parquet"
    write_parquet(pa.Table.from_pylist(built.live.rows, schema=ATLAS_SCHEMA), atlas)
    measured = build_method({"name": name}, {"coefficients": coefficients, "atlas": atlas}, num_experts=8)
    replayed = decode_all(target, oracle, measured, prompts, limits, ar_outputs)
    assert outputs(replayed) == ar_outputs
    assert [c["selected"] for r in replayed for c in r.cycles] == [c["selected"] for r in live for c in r.cycles]
    assert sum(c["accepted"] for r in replayed for c in r.cycles) > 0
    with pytest.raises(SpecFitError, match="needs the `atlas` input"):
        build_method({"name": name}, {"coefficients": coefficients}, num_experts=8)
