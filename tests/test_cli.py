"""`specfit generate`'s arguments: --configfile takes one file a flag, so the prompt after it stays the prompt."""

from specfit import cli


def test_a_prompt_after_configfile_is_the_prompt():
    args = cli.parser().parse_args(["generate", "--configfile", "a.yaml", "--configfile", "b.yaml", "--model", "toy",
                                    "What is 12 * 7?"])
    assert args.configfile == ["a.yaml", "b.yaml"] and args.prompt == "What is 12 * 7?"
    assert cli.parser().parse_args(["generate", "hi"]).configfile is None
