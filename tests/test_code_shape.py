"""House rule: functions under 80 lines, in the package and app.py. Lines are counted from the
``def`` to the function's last line (docstring and nested functions included, decorators not).

A function over the limit in code this branch does not own is listed in ``KNOWN_LONG`` with its
length today: it is reported (a warning in the test summary) until it is split, and it fails the
test if it grows or once it is split (then its entry goes)."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

from source_trees import parse_file

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
#: "path:function" -> its length today, for long functions awaiting a split by their owners
KNOWN_LONG: dict[str, int] = {}


def long_functions(files: list[Path], root: Path = ROOT, limit: int = LIMIT) -> dict[str, int]:
    """ "path:function" -> lines, for every function (methods and nested ones too) over ``limit``."""
    out: dict[str, int] = {}
    for path in files:
        for node in ast.walk(parse_file(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out[f"{path.relative_to(root).as_posix()}:{node.name}"] = length
    return out


def test_the_count_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT - 1))  # def + LIMIT - 1 lines: at the limit
    sample = tmp_path / "sample.py"
    sample.write_text(
        f"class A:\n    def fits(self):\n{body}\n\n    def long(self):\n{body}\n        y = 0\n"
    )
    assert long_functions([sample], tmp_path) == {"sample.py:long": LIMIT + 1}


def test_every_function_is_under_80_lines() -> None:
    files = sorted((ROOT / "sapiens2").rglob("*.py")) + [ROOT / "app.py"]
    found = long_functions(files)
    new = {name: n for name, n in found.items() if name not in KNOWN_LONG}
    assert not new, f"functions over {LIMIT} lines: {new}"
    grown = {name: (n, KNOWN_LONG[name]) for name, n in found.items() if n > KNOWN_LONG.get(name, n)}
    assert not grown, f"known long functions grew (now, before): {grown}"
    split = sorted(set(KNOWN_LONG) - set(found))
    assert not split, f"no longer over {LIMIT} lines, take them off KNOWN_LONG: {split}"
    if found:
        warnings.warn(f"functions over {LIMIT} lines, awaiting a split: {found}", stacklevel=1)


def test_a_source_the_interpreter_fails_to_parse_is_parsed_in_a_fresh_one(monkeypatch) -> None:
    """source_trees.parse_file's way round CPython 3.11.7's AST recursion-depth bug."""
    path = ROOT / "sapiens2" / "errors.py"
    expected = ast.dump(ast.parse(path.read_text(encoding="utf-8"), str(path)))

    def broken(*args, **kwargs):
        raise SystemError("AST constructor recursion depth mismatch (before=141, after=75)")

    monkeypatch.setattr(ast, "parse", broken)
    assert ast.dump(parse_file(path)) == expected
