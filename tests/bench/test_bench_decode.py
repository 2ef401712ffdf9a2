"""`python -m specfit.bench decode`: every verify path decodes the same requests to the same tokens; one line each."""

from specfit.bench import decode as bench


def test_every_path_decodes_every_request_to_the_same_tokens(capsys):
    bench.main(["--requests", "2", "--new", "6"])
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith(tuple(bench.PATHS))]
    assert len(rows) == len(bench.PATHS) == 4
    assert all(len(line.split("(")[-1].split(",")) == 2 for line in rows)  # two requests each
    assert out[-1] == "outputs identical on every path: yes"


def test_questions_are_the_first_of_their_category(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text('{"category": "a", "turns": ["x"]}\n{"category": "b", "turns": ["y"]}\n'
                    '{"category": "a", "turns": ["z", "w"]}\n')
    assert bench.questions(path, "a", 5) == ["x", "z"]
    assert bench.questions(path, "a", 1) == ["x"]
