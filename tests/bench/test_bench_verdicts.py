"""`python -m specfit.bench verdicts`: two reports' verdicts compared cell by cell, by table id, row key and column."""

import json

import pytest

from specfit.bench.verdicts import compare, main, read_tables, verdict_words, verdicts
from specfit.report.page import Estimate, show
from specfit.report.verdict import Outcome, Verdict


def ratio(value, low, high) -> str:
    """A ratio cell as the report prints it."""
    return show(Estimate(value, low, high, Verdict.of(low, high)), ".2f", "×")


def report(tmp_path, name, cells: dict) -> str:
    """A report folder whose tables.json holds one table per id: {(id, key): {column: cell}}."""
    tables = {}
    for (tid, key), row in cells.items():
        t = tables.setdefault(tid, {"id": tid, "part": "p", "section": "s", "caption": "c",
                                    "header": ["Workload", *row], "rows": []})
        t["rows"].append({"key": key, "cells": [key.split("/")[0], *row.values()]})
    folder = tmp_path / name
    folder.mkdir()
    (folder / "tables.json").write_text(json.dumps({"tables": list(tables.values())}))
    return str(folder)


def test_the_verdicts_a_printed_cell_holds():
    assert verdict_words(ratio(1.10, 1.03, 1.18)) == ("faster",)
    assert verdict_words(ratio(0.97, 0.91, 1.04)) == ("tie",)
    sweep = ", ".join(f"{s}: {ratio(*r)}" for s, r in ((12, (1.1, 1.03, 1.18)), (3, (1.07, 0.99, 1.14))))
    assert verdict_words(sweep) == ("faster", "tie")  # the slot sweep's cell: one verdict per slot count
    assert verdict_words(Outcome(Verdict.MISSED, basis=Verdict.TIE).answer()) == ("no",)
    assert verdict_words(Outcome(Verdict.NOT_JUDGED, "no eagle3 run in this cell").answer()) == ("not judged",)
    assert verdict_words(str(Verdict.REFUTED)) == ("refuted",)
    assert verdict_words("met (R² 0.978)") == ("met",)
    for other in ("0.90× (slower)", "No", "Yes (12)", "12.31 [11.80, 12.90]", "toy", "nothing is yes"):
        assert verdict_words(other) == (), other  # the paper's claim, a cache cell, a TPS, prose


def test_two_reports_compared_by_id_and_key_not_by_position(tmp_path, capsys):
    a = report(tmp_path, "a", {
        ("claims/toy/d", "gsm8k/ar"): {"This run": ratio(1.36, 1.26, 1.47), "Verdict": "confirmed"},
        ("claims/toy/d", "gsm8k/gain"): {"This run": f"12: {ratio(1.1, 1.03, 1.18)}, 3: {ratio(1.07, 1.01, 1.14)}",
                                         "Verdict": "confirmed"},
        ("ca/toy/d", "gsm8k/0"): {"ca / best": ratio(0.93, 0.87, 0.99), "Goal met": "no"},
        ("ca/toy/d", "gsm8k/12"): {"ca / best": ratio(1.01, 0.95, 1.08), "Goal met": "no"},
        ("why/toy/d", "#0"): {"Why": f"ca is {ratio(0.93, 0.87, 0.99)}"},  # a row without a key: left out
        ("only-a/toy/d", "x"): {"Verdict": "tie"},
    })
    b = report(tmp_path, "b", {  # another run: numbers moved, rows in another order
        ("ca/toy/d", "gsm8k/12"): {"ca / best": ratio(0.91, 0.85, 0.98), "Goal met": "no"},
        ("ca/toy/d", "gsm8k/0"): {"ca / best": ratio(0.95, 0.89, 1.02), "Goal met": "yes"},
        ("claims/toy/d", "gsm8k/gain"): {"This run": f"12: {ratio(1.09, 1.02, 1.17)}, 3: {ratio(1.05, 0.98, 1.12)}",
                                         "Verdict": "confirmed"},
        ("claims/toy/d", "gsm8k/ar"): {"This run": ratio(1.30, 1.21, 1.40), "Verdict": "confirmed"},
        ("why/toy/d", "#0"): {"Why": f"ca is {ratio(1.01, 0.95, 1.08)}"},
    })
    va, vb = verdicts(read_tables(tmp_path / "a")), verdicts(read_tables(tmp_path / "b" / "tables.json"))
    assert ("why/toy/d", "#0", "Why") not in va
    r = compare(va, vb)
    assert (r["common"], r["agree"], r["only_a"], r["only_b"]) == (8, 4, 1, 0)
    assert r["kinds"] == {"tie against a direction": 3, "goal answer": 1}
    main([a, b])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "8 verdict cells in both reports: 4 agree, 4 differ (50.0% agree); only in A 1, only in B 0"
    assert "  ca/toy/d | gsm8k/0 | ca / best: slower -> tie" in out
    assert "  ca/toy/d | gsm8k/12 | ca / best: tie -> slower" in out
    assert "  claims/toy/d | gsm8k/gain | This run: faster, faster -> faster, tie" in out


def test_a_reversal_is_named(tmp_path, capsys):
    a = report(tmp_path, "a", {("t", "k"): {"r": ratio(1.2, 1.1, 1.3), "Verdict": "confirmed"}})
    b = report(tmp_path, "b", {("t", "k"): {"r": ratio(0.8, 0.7, 0.9), "Verdict": "refuted"}})
    main([a, b])
    assert "  reversal: 2" in capsys.readouterr().out


def test_a_report_without_tables_json_is_refused(tmp_path):
    (tmp_path / "old").mkdir()
    with pytest.raises(SystemExit, match="tables.json"):
        main([str(tmp_path / "old"), str(tmp_path / "old")])


def test_kinds_of_difference():
    from specfit.bench.verdicts import kind

    assert kind(("tie",), ("refuted",)) == kind(("faster", "tie"), ("faster", "slower")) == "tie against a direction"
    assert kind(("met",), ("not met",)) == kind(("no",), ("yes",)) == "goal answer"
    assert kind(("confirmed",), ("refuted",)) == kind(("tie", "faster"), ("tie", "slower")) == "reversal"
    assert kind(("not required",), ("no",)) == kind(("tie",), ("tie", "tie")) == "other"
