"""The README's command table documents every command and every flag the CLI has.

A new user reads the table, not ``--help``: a command or flag missing there (``token issue``,
``serve --auth-mode`` were) is one they never learn about.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def commands(parser: argparse.ArgumentParser, prefix: str = "sandbox-gateway") -> Iterator[tuple[str, list[str]]]:
    """(command line, its option strings) for every leaf subcommand, ``--help`` left out."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        flags = [max(a.option_strings, key=len) for a in parser._actions
                 if a.option_strings and not isinstance(a, argparse._HelpAction)]
        yield prefix, flags
        return
    for name, sub in subparsers[0].choices.items():
        yield from commands(sub, f"{prefix} {name}")


def table_rows() -> dict[str, str]:
    """The README's command table: the command cell of each row, keyed by its command words."""
    section = README.read_text(encoding="utf-8").split("## Command line", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if match := re.match(r"\| `(sandbox-gateway(?: [a-z][a-z-]*)+)(.*?)` \|", line):
            rows[match.group(1)] = match.group(2)
    return rows


CASES = list(commands(build_parser()))


def test_every_command_is_walked() -> None:
    assert {line for line, _ in CASES} >= {"sandbox-gateway serve", "sandbox-gateway token issue"}


@pytest.mark.parametrize(("command", "flags"), CASES, ids=[line for line, _ in CASES])
def test_readme_table_documents_the_command_and_its_flags(command: str, flags: list[str]) -> None:
    rows = table_rows()
    assert command in rows, f"README.md's command table has no row for `{command}`"
    documented = set(re.findall(r"--[a-z][a-z-]*", rows[command]))
    # a BooleanOptionalAction's --no-x documents --x too
    documented |= {f"--{flag.removeprefix('--no-')}" for flag in documented if flag.startswith("--no-")}
    missing = sorted(set(flags) - documented)
    assert not missing, f"README.md's `{command}` row lacks {missing}"


def test_readme_puts_the_cli_on_path_before_using_it() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.index("source .venv/bin/activate") < text.index("sandbox-gateway route")
