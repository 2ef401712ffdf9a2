"""``python tests/parse_only.py JSON``: run Python programs only as far as reading their arguments.

``JSON`` is a list of commands, each a list of words (``["specfit", "generate", "--model", "toy"]``). Each prints
its exit status: 0 when its arguments parse, the program's own usage error (2) when not; nothing else runs. The
exit status is 1 when any did not parse. ``PROGRAM`` is a
console script (``specfit``, ``snakemake``), ``python -m MODULE``, ``pip`` or ``pytest``. argparse programs stop at
their first successful ``parse_args`` (argparse's, or that of a subclass the program loaded, such as Snakemake's
configargparse); pip's own parser (optparse) is asked directly; pytest collects without running. Used by
tests/test_doc_commands.py for the commands the docs mark as too long or too machine-specific to run.
"""

import argparse
import json
import runpy
import sys
from importlib.metadata import entry_points


def _stop_once_parsed(cls: type) -> None:
    """Make ``cls.parse_args`` exit 0 once the arguments parsed (a bad one exits before, with the usage error)."""
    original = cls.parse_args

    def parse_args(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise SystemExit(0)

    cls.parse_args = parse_args


def _parsers(cls: type = argparse.ArgumentParser):
    """``cls`` and its subclasses loaded now that define their own ``parse_args``."""
    if "parse_args" in cls.__dict__:
        yield cls
    for sub in cls.__subclasses__():
        yield from _parsers(sub)


def pip(args: list[str]) -> None:
    from pip._internal.cli.main_parser import parse_command
    from pip._internal.commands import create_command

    name, rest = parse_command(args)
    create_command(name).parse_args(rest)  # a bad option exits 2
    raise SystemExit(0)


def parse(argv: list[str]) -> None:
    """Exit (SystemExit) with ``argv``'s parse status."""
    program, *args = argv
    if program in ("python", "python3"):
        if args[:1] != ["-m"] or len(args) < 2:
            sys.exit(f"parse_only: only `python -m MODULE` is understood, not {argv}")
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif program == "pip":
        pip(args)
    elif program == "pytest":
        import pytest

        sys.exit(pytest.main(["--collect-only", "-q", *args]))
    else:
        scripts = entry_points(group="console_scripts", name=program)
        if not scripts:
            sys.exit(f"parse_only: no console script {program!r} in this environment")
        sys.argv = [program, *args]
        script = next(iter(scripts)).load()
        for cls in _parsers():
            if cls is not argparse.ArgumentParser:
                _stop_once_parsed(cls)
        script()
    sys.exit(f"parse_only: {program} returned without parsing its arguments with argparse")


def main(commands: list[list[str]]) -> None:
    _stop_once_parsed(argparse.ArgumentParser)
    failed = 0
    for argv in commands:
        try:
            parse(argv)
        except SystemExit as done:
            status = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
            if isinstance(done.code, str):
                print(done.code, file=sys.stderr)
        print(f"parse_only {status}: {' '.join(argv)}", flush=True)
        failed += status != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
