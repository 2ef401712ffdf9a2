import pytest
import torch

from specfit.spec import Limits, MethodConfig, build_method, decode_request
from specfit.spec.methods import SpecFit
from specfit.spec.routes import AtlasRoutes, LiveRoutes, atlas_table
from specfit.io import write_parquet
from specfit.spec.routes import ATLAS_SCHEMA
from specfit.stage import SpecFitError

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]  # intercepts b_0..b_7
BETA = 0.05


def decode_all(target, drafter, method, prompts, limits):
    return [
        decode_request(target, drafter, method, p, request_id=i, question_id=100 + i, limits=limits)
        for i, p in enumerate(prompts)
    ]


def outputs(results):
    return [r.request["output_ids"] for r in results]


def specfit(routes, k_max=7):
    return SpecFit(MethodConfig("specfit", k_max=k_max), B, BETA, routes, num_experts=8)


def test_eagle3_and_specfit_equal_ar(target, drafter, prompts, limits):
    ar = decode_all(target, drafter, build_method({"name": "ar"}), prompts, limits)
    eagle = decode_all(target, drafter, build_method({"name": "eagle3"}), prompts, limits)
    live = specfit(LiveRoutes())
    fit = decode_all(target, drafter, live, prompts, limits)
    assert outputs(eagle) == outputs(ar)
    assert outputs(fit) == outputs(ar)
    for r in ar:
        assert r.request["n_output"] == len(r.request["output_ids"])
        assert sum(c["committed"] for c in r.cycles) == r.request["n_output"] - 1
        assert all(c["pool_token"][1:] == [] and c["committed"] == 1 for c in r.cycles)
    for r in eagle:
        assert sum(c["committed"] for c in r.cycles) == r.request["n_output"] - 1
        assert all(len(c["selected"]) == min(7, len(c["pool_token"]) - 1) for c in r.cycles)
    print([[c["drafted_levels"] for c in r.cycles] for r in fit])
    print([[c["accepted"] for c in r.cycles] for r in eagle])
