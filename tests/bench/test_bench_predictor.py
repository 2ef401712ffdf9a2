from specfit.bench import predictor


def test_prints_size_and_a_measured_time(capsys):
    predictor.main(["--hidden", "16", "--layers", "3", "--experts", "8", "--top-k", "2", "--device", "cpu",
                    "--dtype", "float32", "--repeats", "5"])
    out = capsys.readouterr().out
    assert "parameters:            792 (0.0M)" in out  # (2 * 16 + 1) * 3 * 8
    assert "one pool on cpu (float32): median" in out
