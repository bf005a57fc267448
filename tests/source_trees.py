"""Parse the package's source for the structure tests, robust to a CPython 3.11.7 bug.

``ast.parse`` can raise ``SystemError: AST constructor recursion depth mismatch`` in a process
whose recursion bookkeeping an earlier test's library left off (CPython gh-106905, fixed in later
3.11 releases); it happened once in a full run, in an xdist worker. The same source then parses
in a fresh interpreter, whose tree comes back pickled (AST nodes pickle)."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

_CHILD = "import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps(ast.parse(open(sys.argv[1], encoding='utf-8').read(), sys.argv[1])))"


def parse_file(path: Path) -> ast.Module:
    """``ast.parse`` of the file, named by its path."""
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source, str(path))
    except SystemError:  # the interpreter's bug, not the file's: parse it in a fresh one
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, check=True)
        return pickle.loads(out.stdout)
