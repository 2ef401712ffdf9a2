"""The paper beside this run: its figures, the headline ratios, and which config method plays which role."""

from report_fakes import DEVICE, runs_by, tiny_spec
from report_md import find, pct_text, ratio_of, tps_text, x_text

from specfit.report.paper import Roles, paper_device


def test_paper_side_by_side_compares_ratios(built):
    spec, written, out, tables = built
    header, rows = find(tables, f"Headline ratios, {DEVICE} vs paper a100, gsm8k")
    cells = {row[0]: row[1:] for row in rows}
    runs = runs_by(written)
    ci = ratio_of(written, runs["specfit", 4], runs["eagle3", 4])
    gain = 100 * (written[runs["specfit", 4]]["tps_dec"] / written[runs["eagle3", 4]]["tps_dec"] - 1)
    assert cells["SpecFit over cached EAGLE-3 (%)"] == ["7.0", pct_text(ci)]
    assert pct_text(ci).startswith(f"{gain:.1f} [")
    header, rows = find(tables, f"{DEVICE} vs paper a100, gsm8k")
    for row in rows:
        run = runs[row[0], 4 if row[1] == "Yes" else 0]
        assert row[3] == tps_text(written, run)
        assert row[5] == x_text(ratio_of(written, run, runs["ar", 0]))
    assert cells["SpecFit (cache) over AR without cache (×)"][0] == "2.29"  # as the text says; 10.79 / 4.70 = 2.30
    assert cells["Vanilla EAGLE-3 over AR without cache (×)"][0] == "1.33"  # not stated for GSM8K: computed
    assert "miniature" in (out / "report.md").read_text()


def test_roles_read_the_route_source_with_its_default():
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"))
    del spec["methods"]["specfit"]["routes"]  # the default: the atlas, exact
    assert Roles.of(spec) == Roles(ar="ar", eagle3="eagle3", specfit="specfit", noisy=["specfit-noisy"])
    spec["methods"]["specfit"]["routes"] = "live"  # an atlas build's source plays no role
    assert Roles.of(spec).specfit is None


def test_devices_map_to_the_paper_by_name_then_order():
    spec = tiny_spec(devices=(DEVICE, "cpu-4090link", "cpu-other"))
    assert [paper_device(spec, d) for d in spec["devices"]] == ["a100", "rtx4090", "rtx4090"]
