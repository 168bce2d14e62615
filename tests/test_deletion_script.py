"""scripts/deletion.py: which statements it deletes, and that each mutant still compiles."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import deletion
from mutation import MODULES, Module

SOURCE = '''"""A module docstring."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from pathlib import Path

Kind = Literal["a", "b"]
T = TypeVar("T")
LIMIT = 3


class Box:
    """A class docstring."""

    __slots__ = ("n",)
    n: int

    def grow(self, by: int) -> None:
        self.n += by
        if self.n > LIMIT:
            self.n = LIMIT
        else:
            pass


def work(x: int) -> int:
    global LIMIT
    try:
        y = x + 1; z = y
    finally:
        os.getpid()
    return (
        y
    )
'''


def test_every_statement_but_declarations_is_deleted_once_outermost_first() -> None:
    found = deletion.deletions(SOURCE, Module("m.py", ()))
    assert [(d.first, d.last, d.text) for d in found] == [
        (12, 12, "LIMIT = 3"),
        (22, 22, "self.n += by"),
        (23, 26, "if self.n > LIMIT:"),
        (24, 24, "self.n = LIMIT"),
        (31, 34, "try:"),
        # `y = x + 1; z = y` shares its line: neither half is deleted alone
        (34, 34, "os.getpid()"),
        (35, 37, "return ("),
    ]


def test_each_deletion_is_a_pass_at_the_statements_indent_and_compiles() -> None:
    for d in deletion.deletions(SOURCE, Module("m.py", ())):
        mutant = deletion.mutate(SOURCE, d)
        compile(mutant, "m.py", "exec")
        lines = mutant.splitlines()
        assert lines[d.first - 1] == f"{d.indent}pass"
        assert len(lines) == len(SOURCE.splitlines()) - (d.last - d.first)


def test_a_scoped_module_deletes_inside_its_scope_only() -> None:
    found = deletion.deletions(SOURCE, Module("m.py", (), scope=("work",)))
    assert [d.first for d in found] == [31, 34, 35]


def test_the_modules_are_mutation_pys_and_each_has_deletions() -> None:
    root = Path(__file__).resolve().parent.parent
    for name, module in MODULES.items():
        found = deletion.deletions((root / module.path).read_text(), module)
        assert found, name
