"""The package's folders are its layers: each module imports only from its own layer or lower ones.

The order is defined once, here (docs/DESIGN.md explains it). Every import is read from the source
(top-level and function-local, ``TYPE_CHECKING`` ones too), so a failure names the file, the line
and the import that runs up a layer or closes a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from source_trees import parse_file

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sapiens2"

#: Lowest first. A module may import from its own layer and from any layer before it. ``face``: the
#: public face at the package root (``__init__``, ``__main__``), which names what users import.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "data"}),
    frozenset({"runtime"}),
    frozenset({"zerogpu"}),
    frozenset({"models"}),
    frozenset({"inputs", "outputs"}),  # the photo in, the files out: side by side (docs/DESIGN.md)
    frozenset({"ops"}),
    frozenset({"tasks"}),
    frozenset({"video", "batch"}),  # many inputs through any pipeline: clips, datasets
    frozenset({"search"}),  # people found by appearance or pose: made through batch, used by serving
    frozenset({"serving"}),
    frozenset({"ui", "cli", "face"}),
)
MAX_ROOT_MODULES = 8
#: Third-party packages only some layers may import: Gradio is the UI's, spaces is ZeroGPU's.
ONLY_IN = {"gradio": {"ui"}, "gradio_client": {"ui"}, "spaces": {"zerogpu"}}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted (a module, or a name in one)
    line: int

    def where(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path) -> str:
    """The package relative imports in ``path`` start from."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def imports_of(path: Path) -> Iterator[Import]:
    tree = parse_file(path)
    name = module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(path).split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            for alias in node.names:
                # ``from .. import serving`` names a module; ``from ..errors import X`` a name in one
                candidate = f"{prefix}.{alias.name}"
                yield Import(name, candidate if is_module(candidate) else prefix, node.lineno)


def is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def layer_of(dotted: str) -> str | None:
    """The layer of a module of the package (None outside it)."""
    parts = dotted.split(".")
    if parts[0] != "sapiens2":
        return None
    if len(parts) == 1 or parts[1] == "__main__":
        return "face"
    return parts[1]


def rank(layer: str) -> int:
    for i, names in enumerate(LAYERS):
        if layer in names:
            return i
    raise AssertionError(f"sapiens2/{layer} is in no layer: add it to LAYERS in tests/test_layers.py")


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def all_imports() -> list[Import]:
    return [imp for path in package_modules() for imp in imports_of(path)]


def upward_imports() -> list[str]:
    """Every import that runs up a layer, as ``file:line imports target (layer above layer)``."""
    bad = []
    for imp in all_imports():
        own, theirs = layer_of(imp.module), layer_of(imp.target)
        if theirs is not None and rank(theirs) > rank(own):
            bad.append(f"{imp.where()} imports {imp.target} ({theirs}, above {own})")
    return bad


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {module_name(p): set() for p in package_modules()}
    for imp in all_imports():
        target = imp.target
        while target and target not in edges:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != imp.module and layer_of(target) is not None:
            edges[imp.module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


# ----------------------------------------------------------------------------- the tests


def test_every_folder_is_a_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    roots = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    for name in folders | roots:
        rank(name)  # raises naming the folder that is in no layer


def test_no_module_imports_from_a_layer_above_it() -> None:
    bad = upward_imports()
    assert not bad, "imports that run up a layer (tests/test_layers.py LAYERS):\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_few_modules_at_the_package_root() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}"


def test_gradio_and_spaces_stay_in_their_layers() -> None:
    bad = []
    for imp in all_imports():
        top = imp.target.split(".")[0]
        allowed = ONLY_IN.get(top)
        if allowed is not None and layer_of(imp.module) not in allowed:
            bad.append(f"{imp.where()} imports {imp.target} (only {', '.join(sorted(allowed))} may)")
    assert not bad, "\n".join(bad)


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The parser reads relative, absolute and function-local imports, and the cycle finder finds
    a cycle, so a passing run means there was nothing to find."""
    found = {(i.target, i.line) for i in imports_of(PACKAGE / "serving" / "request_runner.py")}
    assert any(t.startswith("sapiens2.") for t, _ in found)
    local = []
    for path in package_modules():
        inside = _in_a_function(path)
        local += [i for i in imports_of(path) if i.target.startswith("sapiens2.") and inside(i.line)]
    assert local, "no function-local import of the package was read"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert layer_of("sapiens2.tasks.pose") == "tasks" and layer_of("sapiens2") == "face"
    assert rank("errors") < rank("models") < rank("tasks") < rank("serving") < rank("ui")


def _in_a_function(path: Path) -> Callable[[int], bool]:
    """Whether a line of ``path`` lies inside one of its functions."""
    tree = parse_file(path)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    spans = [(n.lineno, n.end_lineno or 0) for n in ast.walk(tree) if isinstance(n, kinds)]
    return lambda line: any(a < line <= b for a, b in spans)


# ----------------------------------------------------------------------------- one name, one thing


def task_folders() -> dict[str, Path]:
    """Builtin task name -> the folder its ``TASK`` is declared in (under ``sapiens2/tasks/``)."""
    from sapiens2.tasks import registry

    return {
        name: PACKAGE / "tasks" / task.pipeline.__module__.split(".")[2]
        for name, task in registry.declared().items()
        if task.pipeline.__module__.startswith("sapiens2.tasks.")
    }


def prefixed_elsewhere(paths: list[Path], prefix: str, folder: Path) -> list[Path]:
    """Modules named ``<prefix>_*.py`` outside ``folder``."""
    return [p for p in paths if p.stem.startswith(f"{prefix}_") and folder not in p.parents]


def shared_base_names(paths: list[Path]) -> dict[str, list[Path]]:
    """Base name -> the modules of that name, where more than one has it (``__init__`` aside)."""
    seen: dict[str, list[Path]] = {}
    for path in paths:
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(path)
    return {name: where for name, where in seen.items() if len(where) > 1}


def shared_class_names(paths: list[Path]) -> dict[str, list[str]]:
    """Class name -> ``file:line`` of each class of that name, where more than one has it."""
    seen: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.walk(parse_file(path)):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(f"{path.name}:{node.lineno}")
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_one_folder_per_task() -> None:
    """Every builtin task is declared in its own folder ``sapiens2/tasks/<name>/``, whose
    ``__init__`` exposes its ``TASK``; no module outside that folder carries the task's prefix."""
    import importlib

    folders = task_folders()
    assert len(folders) >= 8, f"builtin tasks found: {sorted(folders)}"
    bad = []
    for name, folder in folders.items():
        package = importlib.import_module(f"sapiens2.tasks.{folder.name}")
        if folder.parent != PACKAGE / "tasks" or getattr(package, "TASK", None) is not _task(name):
            bad.append(f"{name}: TASK is not exposed by a folder sapiens2/tasks/<name>/ ({folder})")
        for prefix in {name, folder.name}:
            bad += [f"{p.relative_to(ROOT)} carries {name}'s prefix outside {folder.relative_to(ROOT)}"
                    for p in prefixed_elsewhere(package_modules(), prefix, folder)]  # fmt: skip
    assert not bad, "\n".join(bad)


def _task(name: str) -> object:
    from sapiens2.tasks import registry

    return registry.get(name)


def test_no_two_modules_share_a_base_name() -> None:
    shared = shared_base_names(package_modules())
    assert not shared, "modules sharing a base name:\n" + "\n".join(
        " ".join(str(p.relative_to(ROOT)) for p in where) for where in shared.values()
    )


def test_no_two_classes_share_a_name() -> None:
    shared = shared_class_names(package_modules())
    assert not shared, "classes sharing a name:\n" + "\n".join(
        f"{n}: {', '.join(w)}" for n, w in shared.items()
    )


def test_the_name_checks_find_what_they_check(tmp_path: Path) -> None:
    """Each check names a planted offender, so a passing run means there was nothing to find."""
    made = []
    for rel in (
        "a/__init__.py",
        "b/__init__.py",
        "a/runner.py",
        "b/runner.py",
        "pose/x.py",
        "ops/pose_codec.py",
    ):
        path = tmp_path / rel
        path.parent.mkdir(exist_ok=True)
        path.write_text("class Job:\n    pass\n")
        made.append(path)
    assert list(shared_base_names(made)) == ["runner.py"]
    assert shared_class_names(made)["Job"][0] == "__init__.py:1" and len(shared_class_names(made)["Job"]) == 6
    assert prefixed_elsewhere(made, "pose", tmp_path / "pose") == [tmp_path / "ops" / "pose_codec.py"]


#: A module holds one idea; past this many lines it is usually two (the networks in models/nn/
#: follow their checkpoints' structure, one file per architecture, and are exempt).
MAX_MODULE_LINES = 400
EXEMPT_FROM_LENGTH = PACKAGE / "models" / "nn"


def long_modules(paths: list[Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    lines = {
        p: len(p.read_text(encoding="utf-8").splitlines())
        for p in paths
        if EXEMPT_FROM_LENGTH not in p.parents
    }
    return [f"{p} ({n} lines)" for p, n in lines.items() if n > limit]


def test_no_module_over_400_lines_outside_models_nn(tmp_path: Path) -> None:
    found = long_modules(package_modules())
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split them along their ideas):\n" + "\n".join(
        found
    )
    planted = tmp_path / "long.py"
    planted.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules([planted]) == [f"{planted} ({MAX_MODULE_LINES + 1} lines)"]
