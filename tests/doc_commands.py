"""The commands the docs show a user, read from their sources: the fenced ``bash`` blocks of README.md and docs/*.md,
and the indented commands in the opening comments of the config overlays and profiles.

A block (or the commands of a comment) may carry a marker just before it, in the doc's source:

    <!-- doc-test: parse-only: why -->        (Markdown; a YAML comment says ``# doc-test: parse-only: why``)

for a command too long or too machine-specific to run in the test suite (a GPU, a cluster, minutes of training):
the test then checks only that its programs and their flags parse. A fenced block whose first line is a comment
naming a file (``# mylab/chain.py``) is that file's content, which the page's commands expect at the workflow root.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

SHELLS = ("bash", "sh", "shell", "console")
MARK = re.compile(r"^(?:<!--|#)\s*doc-test:\s*parse-only:\s*(.+?)\s*(?:-->)?$")
FENCE = re.compile(r"^```(\S*)\s*$")
FILE = re.compile(r"^#\s+([\w./-]+\.\w+)\s*$")  # a block's first line naming its file
HEADER_COMMAND = re.compile(r"^#\s{5}(\S.*)$")  # `#` and five spaces: a command in a YAML file's opening comment
OPERATORS = ("&&", "||", "|", ";")
PROGRAMS = ("snakemake", "specfit", "python", "python3", "pip", "pytest")


@dataclass(frozen=True)
class Block:
    """Commands a doc shows together, one a line, each with its comment stripped; ``parse_only``: the marker's
    reason, None when the test runs them."""
    source: str  # the doc's path from the root, and the line of the block's first command
    line: int
    commands: tuple[str, ...]
    parse_only: str | None

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"


def _command(line: str) -> str:
    """``line`` without its shell comment (a ``#`` outside quotes that starts a word)."""
    quote, prev = None, " "
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            return line[:i].strip()
        prev = ch
    return line.strip()


def markdown_blocks(path: Path, root: Path) -> tuple[list[Block], dict[str, str]]:
    """A Markdown page's shell blocks, and its files (a fenced block whose first line names a file) by path."""
    blocks, files = [], {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence or not fence.group(1):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = lines[i + 1:end]
        mark = MARK.match(lines[i - 1].strip()) if i else None
        if fence.group(1) in SHELLS:
            commands = tuple(c for c in map(_command, body) if c)
            blocks.append(Block(path.relative_to(root).as_posix(), i + 2, commands, mark and mark.group(1)))
        elif body and (named := FILE.match(body[0])):
            files[named.group(1)] = "\n".join(body[1:]) + "\n"
        i = end + 1
    return blocks, files


def header_blocks(path: Path, root: Path) -> list[Block]:
    """The commands in a YAML file's opening comment: runs of lines of ``#`` and five spaces, each run with the
    marker on the line just before it, if any."""
    blocks, run, mark, start = [], [], None, 0
    source = path.relative_to(root).as_posix()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("#"):
            break
        if command := HEADER_COMMAND.match(line):
            start = start or number
            run.append(_command(command.group(1)))
            continue
        if run:
            blocks.append(Block(source, start, tuple(run), mark))
            run, start = [], 0
        found = MARK.match(line)
        mark = found.group(1) if found else None
    if run:
        blocks.append(Block(source, start, tuple(run), mark))
    return blocks


def indented_commands(path: Path) -> list[str]:
    """Lines of a Markdown page's indented code that start with a program: commands the test would not see."""
    return [line.strip() for line in path.read_text().splitlines()
            if line.startswith("    ") and line.split(maxsplit=1)[0] in PROGRAMS]


def simple_commands(command: str) -> list[list[str]]:
    """A command line's simple commands (split at ``&&``, ``||``, ``|``, ``;``), each its words: without the
    leading ``NAME=value`` assignments and without redirections."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="&|;<>")
    lexer.whitespace_split = True
    out, words, redirect = [], [], False
    for token in lexer:
        if token in OPERATORS:
            out.append(words)
            words = []
        elif token in (">", ">>", "<"):
            redirect = True
        elif redirect:
            redirect = False
        elif words or not re.fullmatch(r"[A-Za-z_]\w*=.*", token):
            words.append(token)
    return [w for w in [*out, words] if w]


def dry(command: str) -> str:
    """``command`` with each ``snakemake`` that would run jobs made a dry run (``-n``)."""
    quiet = {"-n", "--dry-run", "--dryrun", "--dag", "--lint", "--help", "-h"}
    pieces = re.split(r"(\s(?:&&|\|\||\||;)\s)", command)
    return "".join(re.sub(r"^(\s*(?:\w+=\S*\s+)*snakemake)\b", r"\1 -n", p)
                   if re.match(r"\s*(?:\w+=\S*\s+)*snakemake\b", p) and not quiet & set(p.split()) else p
                   for p in pieces)
