"""`python -m specfit.bench host`: its parts split what they time, and bad input names the run. (Its replay's
decisions: tests/speculative/test_host_replay.py.)"""

import pytest

from specfit.bench import host
from specfit.errors import SpecFitError


def test_the_part_timer_splits_what_it_wraps():
    class Source:
        def routes(self, cycle, pool):
            return None

    class Method:
        route_source = Source()

        def view(self):
            return self.route_source.routes(None, None)

        def choose(self):
            return 1

    m = Method()
    timer = host.PartTimer.on(m)
    m.view(), m.choose()
    parts = timer.parts(1.0)
    assert set(parts) == set(host.PARTS) and parts["route prediction"] > 0 and parts["search"] > 0
    assert parts["view"] >= 0 and abs(sum(parts.values()) - 1.0) < 1e-12


def test_bad_input_names_the_run(workflow_copy, tmp_path, monkeypatch):
    monkeypatch.chdir(workflow_copy(tmp_path))
    cell = ["--device", "cpu-a100", "--workload", "gsm8k", "--slots", "12"]
    with pytest.raises(SpecFitError, match=r"run data/decode/toy/cpu-a100/gsm8k/\S+/slots12 has no recorded cycles"):
        host.main([*cell, "--methods", "specfit"])
    with pytest.raises(SpecFitError, match="eagle3.*not a SpecFit kind"):
        host.main([*cell, "--methods", "eagle3"])
    with pytest.raises(SpecFitError, match="no method 'nope'"):
        host.main([*cell, "--methods", "nope"])
    with pytest.raises(SpecFitError, match="--repeats"):
        host.main([*cell, "--repeats", "0"])


def test_the_stand_in_inputs_of_a_learned_source_are_the_same_every_replay():
    """The rebuilt and grown views replay a learned run on stand-in drafter inputs: both must read the same ones (a
    drafter embedding left at its random initialization once made the two disagree)."""
    from types import SimpleNamespace

    import torch

    from specfit.speculative.learned import LearnedRoutes

    source = object.__new__(LearnedRoutes)
    source.predictor = SimpleNamespace(hidden_size=8)
    method = SimpleNamespace(route_source=source, asks_routes=True)
    cycle = {"request_id": 3, "cycle": 5, "pool_token": [1, 2, 3]}
    (d1, s1), (d2, s2) = (host.stand_in_inputs(method, 50)(cycle) for _ in range(2))
    assert torch.equal(d1.embed_tokens.weight, d2.embed_tokens.weight)
    assert torch.equal(s1.root_input, s2.root_input) and all(torch.equal(s1.feature[v], s2.feature[v]) for v in (1, 2))
