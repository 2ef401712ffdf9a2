"""The paper beside this run: its figures, the headline ratios, and which config method plays which role."""

from report_fakes import DEVICE, runs_by, tiny_spec
from report_md import pct_text, ratio_of, rows, tps_text, x_text

from specfit.report.scope import Roles, paper_gpu


def test_paper_side_by_side_compares_ratios(built):
    _spec, written, out, tables = built
    cells = {key: row[1:] for key, row in rows(tables[f"headline/toy/{DEVICE}/gsm8k"]).items()}
    runs = runs_by(written)
    ci = ratio_of(written, runs["specfit", 4], runs["eagle3", 4])
    gain = 100 * (written[runs["specfit", 4]]["tps_dec"] / written[runs["eagle3", 4]]["tps_dec"] - 1)
    assert cells["vs_cached_eagle3_pct"] == ["7.0", pct_text(ci)]
    assert pct_text(ci).startswith(f"{gain:.1f} [")
    for (rule, mode), row in rows(tables[f"paper/toy/{DEVICE}/gsm8k"]).items():
        run = runs[rule, 4 if mode == "cache" else 0]
        assert row[:2] == [rule, "Yes" if mode == "cache" else "No"]
        assert row[3] == tps_text(written, run)
        assert row[5] == x_text(ratio_of(written, run, runs["ar", 0]))
    assert cells["vs_ar_x"][0] == "2.29"  # as the text says; 10.79 / 4.70 = 2.30
    assert cells["vanilla_eagle3_vs_ar_x"][0] == "1.33"  # not stated for GSM8K: computed
    assert "miniature" in (out / "report.md").read_text()


def test_roles_read_the_route_source_with_its_default():
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"))
    del spec["methods"]["specfit"]["routes"]  # the default: the atlas, exact
    assert Roles.of(spec) == Roles(ar="ar", eagle3="eagle3", specfit="specfit", noisy=["specfit-noisy"])
    spec["methods"]["specfit"]["routes"] = "live"  # an atlas build's source plays no role
    assert Roles.of(spec).specfit is None


def test_devices_map_to_the_paper_by_name_then_order():
    spec = tiny_spec(devices=(DEVICE, "cpu-4090link", "cpu-other"))
    assert [paper_gpu(spec, d) for d in spec["devices"]] == ["a100", "rtx4090", "rtx4090"]


def test_the_paper_config_puts_its_workloads_and_noisy_routes_where_the_paper_has_them(root):
    """config.qwen3-30b-a3b.yaml over config.yaml: gsm8k-odd stands for gsm8k (Table 4 on the RTX 4090), and the
    route-prediction runs are on the A100 on the paper's 40 GSM8K questions, with their own AR baseline."""
    import yaml
    from snakemake.utils import update_config

    from specfit.paper import paper_results
    from specfit.planning.config import validate_config
    from specfit.planning.matrix import DecodeRun, decode_runs, workload_ids
    from specfit.report.scope import paper_workload, stand_ins

    config = yaml.safe_load((root / "config.yaml").read_text())
    update_config(config, yaml.safe_load((root / "config.qwen3-30b-a3b.yaml").read_text()))
    config = validate_config(config, root / "workflow/schemas/config.schema.yaml")
    roles, runs = Roles.of(config), decode_runs(config)
    assert paper_workload(config, "gsm8k-odd") == "gsm8k" and paper_workload(config, "gsm8k") == "gsm8k"
    model = "qwen3-30b-a3b"
    assert stand_ins(config, runs, roles, model, "a100") == {"summarization": "summarization", "gsm8k": "gsm8k"}
    assert stand_ins(config, runs, roles, model, "rtx4090") == {"gsm8k": "gsm8k-odd"}
    paper = paper_results()["route_prediction"]
    q = paper["questions"]
    assert workload_ids(config, "gsm8k-odd") == list(range(q["start"], q["stop"] + 1, q["step"]))
    assert len(workload_ids(config, "gsm8k-odd")) == 40 and config["workloads"]["gsm8k-odd"]["max_requests"] is None
    noisy = [r for r in runs if r.method in roles.noisy]
    assert noisy == [DecodeRun(model, paper["device"], "gsm8k-odd", "specfit-noisy", 48)]
    for method, slots in ((roles.specfit, 48), (roles.ar, 0)):  # exact routes and the baseline, same questions
        assert DecodeRun(model, "a100", "gsm8k-odd", method, slots) in runs
