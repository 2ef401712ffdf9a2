"""`python -m specfit.bench reproduce`: a run's decode jobs and claims' verdicts against a committed reference."""

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specfit.bench.reproduce import claim_verdicts, collect, compare, job_record, main, write_reference
from specfit.results.records import CYCLE_SCHEMA, REQUEST_SCHEMA

JOBS = {"toy/cpu-a100/gsm8k/ar/slots0": 10.0, "toy/cpu-a100/gsm8k/specfit/slots12": 20.0}
OUTPUTS = {0: [5, 6, 7, 2], 1: [8, 9, 2]}  # request id -> output ids
VERDICTS = {"vanilla-eagle3/gsm8k": "confirmed", "specfit-eagle3-cache/gsm8k": "tie"}


def write_job(folder, tps, outputs=OUTPUTS, experts=True, label="emulated A100, virtual clock", device=True):
    """One decode job: two requests of two cycles each, the second cycle accepting one of two selected nodes."""
    folder.mkdir(parents=True)
    requests = [{"request_id": i, "question_id": 400 + i, "output_ids": ids, "n_output": len(ids), "t_request_s": 1.0,
                 "t_prefill_s": 0.1, "h2d_transfers": 3 + i} for i, ids in outputs.items()]
    pq.write_table(pa.Table.from_pylist(requests, schema=REQUEST_SCHEMA), folder / "requests.parquet")
    cycles = [{"request_id": i, "cycle": c, "selected": [1, 2] if c else [], "accepted": c} for i in outputs
              for c in (0, 1)]  # the columns job_record reads; the others null
    pq.write_table(pa.Table.from_pylist(cycles, schema=CYCLE_SCHEMA), folder / "cycles.parquet")
    metrics = {"tps_dec": tps, "tps_dec_low": 0.9 * tps, "tps_dec_high": 1.1 * tps, "timing_label": label,
               "device": {"label": label} if device else None}  # an emulated device's record: its virtual clock
    if experts:
        metrics["experts_executed"] = 40
    (folder / "metrics.json").write_text(json.dumps(metrics))


def write_run(root, tps=JOBS, outputs=None, verdicts=VERDICTS):
    """A run: its data/decode (``outputs``: a job's outputs other than OUTPUTS) and its report's tables.json with one
    claims table and a table that is not one."""
    for job, t in tps.items():
        write_job(root / "decode" / job, t, (outputs or {}).get(job, OUTPUTS))
    rows = [{"key": k, "cells": ["gsm8k", "a claim", "1.10×", v]} for k, v in verdicts.items()]
    claims = {"id": "claims/toy/cpu-a100", "header": ["Workload", "Claim", "This run", "Verdict"], "rows": rows}
    other = {"id": "goals/toy/cpu-a100", "header": ["Goal", "Verdict"], "rows": [{"key": "g", "cells": ["g", "yes"]}]}
    (root / "tables.json").write_text(json.dumps({"tables": [claims, other]}))
    return root / "decode", root / "tables.json"


def test_a_job_record_holds_its_counters_and_hashes(tmp_path):
    write_job(tmp_path / "job", 12.5)
    r = job_record(tmp_path / "job")
    assert r["counters"] == {"n_requests": 2, "output_tokens": 7, "cycles": 4, "h2d_transfers": 7,
                             "experts_executed": 40, "selected_nodes": 4, "accepted": 2}
    assert r["outputs"] == OUTPUTS
    assert r["outputs_sha256"] == hashlib.sha256(json.dumps([[0, [5, 6, 7, 2]], [1, [8, 9, 2]]]).encode()).hexdigest()
    assert r["request_sha256"]["1"] == hashlib.sha256(b"[8, 9, 2]").hexdigest()
    assert (r["tps_dec"], r["tps_dec_low"], r["tps_dec_high"], r["timing_label"]) == (12.5, 0.9 * 12.5, 1.1 * 12.5,
                                                                                       "emulated A100, virtual clock")
    write_job(tmp_path / "old", 12.5, experts=False)
    assert job_record(tmp_path / "old")["counters"]["experts_executed"] is None


def test_collect_and_the_claims_verdicts(tmp_path):
    decode, tables = write_run(tmp_path)
    (decode / "toy/cpu-a100/gsm8k/eagle3/slots0").mkdir(parents=True)  # a job not run yet: no files
    assert set(collect(decode)) == set(JOBS)
    assert claim_verdicts(tables) == {"claims/toy/cpu-a100:vanilla-eagle3/gsm8k": "confirmed",
                                      "claims/toy/cpu-a100:specfit-eagle3-cache/gsm8k": "tie"}


def test_write_reference_round_trip(tmp_path):
    decode, tables = write_run(tmp_path / "run")
    out = tmp_path / "reference" / "toy.json"
    written = write_reference(decode, tables, out)
    text = out.read_text()
    assert json.loads(text) == written
    assert not (tmp_path / "reference" / "toy.json.tmp").exists()
    assert '"outputs"' not in text and "[5, 6, 7, 2]" not in text  # hashes only, no output ids
    jobs = collect(decode)
    assert set(written["jobs"]) == set(JOBS)
    for job, record in written["jobs"].items():
        assert record == {k: v for k, v in jobs[job].items() if k != "outputs"}
    assert written["verdicts"] == claim_verdicts(tables)
    assert set(written["made_with"]) == {"cpu", "commit"}


def test_identical_runs_reproduce(tmp_path, capsys):
    decode, tables = write_run(tmp_path / "run")
    reference = write_reference(decode, tables, tmp_path / "toy.json")
    result = compare(reference, collect(decode), claim_verdicts(tables))
    for c in result["jobs"].values():
        assert c["counters_identical"] and c["outputs_identical"] and c["within_1pct"]
        assert c["tps_rel_diff"] == 0.0 and c["first_divergence"] is None and c["counters_differing"] == []
    assert result["summary"] == {"jobs_compared": 2, "jobs_virtual": 2, "outputs_identical": [2, 2],
                                 "counters_identical": [2, 2], "tps_within_1pct": [2, 2], "largest_abs_tps_diff": 0.0,
                                 "verdicts_identical": [2, 2]}
    assert result["verdicts_changed"] == {} and result["jobs_missing"] == [] and result["verdicts_missing"] == []
    main(["--reference", str(tmp_path / "toy.json"), "--decode", str(decode), "--tables", str(tables)])
    out = capsys.readouterr().out
    assert "all 2 verdicts identical" in out
    assert "  every TPS within 1%: yes (2 / 2 virtual-clock jobs, largest |difference| 0.00%)" in out


def test_a_tps_two_percent_off(tmp_path, capsys):
    ref_decode, ref_tables = write_run(tmp_path / "ref")
    reference = write_reference(ref_decode, ref_tables, tmp_path / "toy.json")
    decode, tables = write_run(tmp_path / "run", tps={**JOBS, "toy/cpu-a100/gsm8k/specfit/slots12": 20.4})
    result = compare(reference, collect(decode), claim_verdicts(tables))
    slow = result["jobs"]["toy/cpu-a100/gsm8k/specfit/slots12"]
    assert slow["tps_rel_diff"] == pytest.approx(0.02) and not slow["within_1pct"]
    assert (slow["tps_dec"], slow["tps_dec_reference"]) == (20.4, 20.0)
    assert slow["counters_identical"] and slow["outputs_identical"]
    assert result["jobs"]["toy/cpu-a100/gsm8k/ar/slots0"]["within_1pct"]
    assert result["summary"]["tps_within_1pct"] == [1, 2]
    assert result["summary"]["largest_abs_tps_diff"] == pytest.approx(0.02)
    with pytest.raises(SystemExit) as e:
        main(["--reference", str(tmp_path / "toy.json"), "--decode", str(decode), "--tables", str(tables)])
    assert e.value.code == 1
    out = capsys.readouterr().out
    assert "  every TPS within 1%: no (1 / 2 virtual-clock jobs, largest |difference| 2.00%)" in out
    row = next(line for line in out.splitlines() if line.startswith("toy/cpu-a100/gsm8k/specfit/slots12"))
    assert row.split()[-3:] == ["20.400", "20.000", "+2.00%"]


def test_a_wall_clock_job_is_shown_without_a_goal(tmp_path, capsys):
    """A link-only device's job (the CPU's own regime) moves with the machine: shown, not held to the goals."""
    link = "toy/cpu-a100link/gsm8k/ar/slots12"
    for root, tps in ((tmp_path / "ref", 50.0), (tmp_path / "run", 46.0)):
        write_run(root)
        write_job(root / "decode" / link, tps, label="emulated link (0.175 GB/s, 50 us latency, wall clock)",
                  device=False)
    reference = write_reference(tmp_path / "ref" / "decode", tmp_path / "ref" / "tables.json", tmp_path / "toy.json")
    result = compare(reference, collect(tmp_path / "run" / "decode"), claim_verdicts(tmp_path / "run" / "tables.json"))
    assert result["jobs"][link]["tps_rel_diff"] == pytest.approx(-0.08) and not result["jobs"][link]["virtual"]
    assert result["summary"]["tps_within_1pct"] == [2, 2] and result["summary"]["jobs_virtual"] == 2
    main(["--reference", str(tmp_path / "toy.json"), "--decode", str(tmp_path / "run" / "decode"), "--tables",
          str(tmp_path / "run" / "tables.json")])  # no SystemExit: every goal met
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(link))
    assert row.endswith("-8.00%  (wall clock: no goal)")


def test_a_changed_output_names_its_request(tmp_path, capsys):
    ref_decode, ref_tables = write_run(tmp_path / "ref")
    reference = write_reference(ref_decode, ref_tables, tmp_path / "toy.json")
    changed = {"toy/cpu-a100/gsm8k/ar/slots0": {0: [5, 6, 7, 2], 1: [8, 4, 2]}}
    decode, tables = write_run(tmp_path / "run", outputs=changed)
    jobs = collect(decode)
    result = compare(reference, jobs, claim_verdicts(tables))
    ar = result["jobs"]["toy/cpu-a100/gsm8k/ar/slots0"]
    assert not ar["outputs_identical"] and ar["counters_identical"]  # same lengths, same counters
    assert ar["first_divergence"] == {"request_id": 1, "position": None, "requests": [1]}  # the file holds hashes
    assert result["jobs"]["toy/cpu-a100/gsm8k/specfit/slots12"]["outputs_identical"]
    assert result["summary"]["counters_identical"] == [1, 1]  # of the jobs whose outputs are identical
    # with both runs' outputs at hand (two collected runs), the token position too
    in_memory = compare({"jobs": collect(ref_decode), "verdicts": {}}, jobs, {})
    assert in_memory["jobs"]["toy/cpu-a100/gsm8k/ar/slots0"]["first_divergence"] == {
        "request_id": 1, "position": 1, "requests": [1]}
    main(["--reference", str(tmp_path / "toy.json"), "--decode", str(decode), "--tables", str(tables)])  # no goal
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("toy/cpu-a100/gsm8k/ar/"))
    assert "no (request 1; 1 differ)" in row
    assert "outputs identical: 1 / 2 jobs" in out


def test_changed_verdicts_and_missing_jobs(tmp_path, capsys):
    ref_decode, ref_tables = write_run(tmp_path / "ref")
    reference = write_reference(ref_decode, ref_tables, tmp_path / "toy.json")
    decode, tables = write_run(tmp_path / "run", tps={"toy/cpu-a100/gsm8k/ar/slots0": 10.0},
                               verdicts={**VERDICTS, "vanilla-eagle3/gsm8k": "tie"})
    result = compare(reference, collect(decode), claim_verdicts(tables))
    assert result["verdicts_changed"] == {"claims/toy/cpu-a100:vanilla-eagle3/gsm8k": ["confirmed", "tie"]}
    assert result["summary"]["verdicts_identical"] == [1, 2]
    assert result["jobs_missing"] == ["toy/cpu-a100/gsm8k/specfit/slots12"] and result["jobs_extra"] == []
    assert result["summary"]["jobs_compared"] == 1
    with pytest.raises(SystemExit):
        main(["--reference", str(tmp_path / "toy.json"), "--decode", str(decode), "--tables", str(tables)])
    out = capsys.readouterr().out
    assert "verdict changed: claims/toy/cpu-a100:vanilla-eagle3/gsm8k: confirmed -> tie" in out
    assert "jobs of the reference missing from this run: toy/cpu-a100/gsm8k/specfit/slots12" in out


def test_an_absent_counter_is_not_compared(tmp_path):
    ref_decode, ref_tables = write_run(tmp_path / "ref")
    reference = write_reference(ref_decode, ref_tables, tmp_path / "toy.json")
    write_job(tmp_path / "old" / "toy/cpu-a100/gsm8k/ar/slots0", 10.0, experts=False)  # a run older than the counter
    c = compare(reference, collect(tmp_path / "old"), {})["jobs"]["toy/cpu-a100/gsm8k/ar/slots0"]
    assert c["counters_identical"] and c["counters_not_compared"] == ["experts_executed"]


def test_write_and_clear_errors(tmp_path, capsys):
    decode, tables = write_run(tmp_path / "run")
    reference = tmp_path / "reference" / "toy.json"
    with pytest.raises(SystemExit, match="no reference at .*toy.json: .*--write"):
        main(["--reference", str(reference), "--decode", str(decode), "--tables", str(tables)])
    with pytest.raises(SystemExit, match="no decode jobs under .*nowhere"):
        main(["--reference", str(reference), "--decode", str(tmp_path / "nowhere"), "--tables", str(tables), "--write"])
    main(["--reference", str(reference), "--decode", str(decode), "--tables", str(tables), "--write"])
    assert capsys.readouterr().out == f"wrote {reference}: 2 decode jobs of {decode}, 2 claims of {tables}\n"
    with pytest.raises(SystemExit, match="tables.json does not exist"):
        main(["--reference", str(reference), "--decode", str(decode), "--tables", str(tmp_path / "tables.json")])


def test_a_counter_that_differs_where_the_outputs_are_identical(tmp_path, capsys):
    ref_decode, ref_tables = write_run(tmp_path / "ref")
    write_reference(ref_decode, ref_tables, tmp_path / "toy.json")
    decode, tables = write_run(tmp_path / "run")
    metrics = decode / "toy/cpu-a100/gsm8k/ar/slots0/metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "experts_executed": 41}))
    with pytest.raises(SystemExit):
        main(["--reference", str(tmp_path / "toy.json"), "--decode", str(decode), "--tables", str(tables)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("toy/cpu-a100/gsm8k/ar/"))
    assert row.split()[1:4] == ["no", "(experts_executed", "+1)"]  # which counter, and by how much (41 - 40)
    assert ("  every counter identical where the outputs are: no (1 / 2 virtual-clock jobs with identical outputs)"
            in out)
