import time

import pytest

from specfit.engine.link import Link, LinkModel, link_for_copy_share


def test_copies_in_flight_share_the_link():
    model = LinkModel(bandwidth_bytes_per_s=1e9, latency_s=1e-3, virtual=True)
    link = Link(model)
    issued = time.perf_counter()
    link.transfer(2_000_000, issued)  # 1 ms latency, then 2 ms of bytes
    link.transfer(2_000_000, issued)  # its latency overlaps the first; its bytes follow the first's
    assert link._free_at == pytest.approx(issued + 1e-3 + 4e-3)
    assert link.busy_s == pytest.approx(2 * model.copy_s(2_000_000)) == pytest.approx(6e-3)
    assert "emulated link" in model.label and "virtual clock" in model.label


def test_waited_link_takes_its_time():
    link = Link(LinkModel(bandwidth_bytes_per_s=1e9, latency_s=0.0))
    issued = time.perf_counter()
    link.transfer(3_000_000, issued)
    assert time.perf_counter() >= link._free_at == pytest.approx(issued + 3e-3)


def test_link_for_copy_share_matches_the_papers_split():
    """Table 2 of the paper: about 400 transfers of 0.41 ms take some 164 of 214 ms per uncached AR step."""
    expert_bytes = 9_437_184  # one Qwen3-30B-A3B expert in bf16
    link = link_for_copy_share(step_compute_s=0.050, transfers_per_step=400, expert_bytes=expert_bytes,
                               share=0.766, latency_s=1e-5)
    assert 400 * link.copy_s(expert_bytes) == pytest.approx(0.164, rel=0.01)
    with pytest.raises(ValueError):
        link_for_copy_share(0.05, 400, expert_bytes, share=1.0)
