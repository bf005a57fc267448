"""Each part of ``spaces`` the package uses without a public API (``sapiens2.zerogpu.internals``,
listed in docs/DESIGN.md under "Patched internals") still has the shape the package relies on.

The installed spaces is read from its source files (parsed, not imported: importing its torch
patching needs a CUDA build of torch), so a failure says which internal changed and where, before
a Space runs on a release nobody checked.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sapiens2.zerogpu import internals, quota

ROOT = Path(__file__).resolve().parents[1]
SPACES = Path(next(iter(importlib.util.find_spec("spaces").submodule_search_locations)))
HINT = "update sapiens2/zerogpu/internals.py and docs/DESIGN.md ('Patched internals') for this spaces"


def tree(relative: str) -> ast.Module:
    path = SPACES / relative
    assert path.is_file(), f"spaces/{relative} is gone: {HINT}"
    return ast.parse(path.read_text(encoding="utf-8"))


def functions(module: ast.AST, name: str) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == name]


def source(relative: str) -> str:
    return (SPACES / relative).read_text(encoding="utf-8")


def test_the_checked_release_is_within_the_required_range() -> None:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    spaces = next(Requirement(x.split("#")[0]) for x in lines if x.strip().startswith("spaces"))
    assert spaces.specifier.contains(internals.CHECKED_SPACES), (
        f"requirements.txt allows {spaces.specifier}, not the spaces {internals.CHECKED_SPACES} the internals "
        "were checked against"
    )


def test_node_table_has_a_duration_factor_per_node_and_the_client_applies_it() -> None:
    """internals.node_configs: spaces/zero/configs.json, one entry per GPU model, each with the
    duration_factor the client multiplies a request by."""
    table = json.loads((SPACES / "zero" / "configs.json").read_text())
    assert isinstance(table, list) and table, f"spaces/zero/configs.json is no longer a list of nodes: {HINT}"
    assert all(isinstance(c.get("duration_factor"), (int, float)) for c in table), (
        f"a node of spaces/zero/configs.json has no numeric duration_factor: {HINT}"
    )
    assert "zerogpu_config['duration_factor']" in source("zero/client.py"), (
        f"spaces' client no longer multiplies a request by its node's duration_factor: {HINT}"
    )
    assert internals.node_configs() == tuple(table) and quota.duration_factor() == max(
        c["duration_factor"] for c in table
    )


def test_decorated_functions_are_cached_by_function_and_by_wrapper() -> None:
    """internals.forget_decorated: spaces.zero.decorator.decorated_cache, a dict that _GPU fills with
    both the task and its wrapper, and consults before wrapping again."""
    from spaces.zero import decorator

    assert isinstance(getattr(decorator, "decorated_cache", None), dict), (
        f"spaces.zero.decorator.decorated_cache is gone or not a dict: {HINT}"
    )
    [gpu] = functions(tree("zero/decorator.py"), "_GPU")
    text = ast.unparse(gpu)
    assert "decorated_cache.update({task: decorated, decorated: decorated})" in text, (
        f"spaces' _GPU no longer caches the task and its wrapper: {HINT}"
    )
    assert "if task in decorated_cache:" in text, f"spaces' _GPU no longer reuses a cached wrapper: {HINT}"


def test_workers_belong_to_one_wrapper_are_forked_and_end_on_sigterm() -> None:
    """GpuEntry decorates a new function per generation and internals.end_workers SIGTERMs idle
    workers: each wrapper keeps its own workers, a worker is a fork, and it ends on SIGTERM."""
    module = tree("zero/wrappers.py")
    assert "multiprocessing.get_context('fork')" in ast.unparse(module), (
        f"spaces' workers are not forks: {HINT}"
    )
    for wrapper in ("regular_function_wrapper", "generator_function_wrapper"):
        [fn] = functions(module, wrapper)
        local = [n for n in fn.body if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "workers"]
        assert local, f"spaces' {wrapper} no longer keeps its workers per wrapped function: {HINT}"
        [worker] = functions(fn, "thread_wrapper")
        assert "signal.signal(signal.SIGTERM" in ast.unparse(worker), (
            f"a spaces worker ({wrapper}) no longer ends on SIGTERM: {HINT}"
        )


def test_cuda_emulation_modes_are_two_torch_modes_entered_function_first() -> None:
    """internals.torch_modes: spaces.zero.torch.patching.function_mode (a TorchFunctionMode) and
    dispatch_mode (a TorchDispatchMode), which spaces enters function mode first."""
    module = tree("zero/torch/patching.py")
    bases = {
        n.name: [ast.unparse(b) for b in n.bases] for n in ast.walk(module) if isinstance(n, ast.ClassDef)
    }
    assigned = {
        t.id: ast.unparse(n.value)
        for n in module.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for name, base in (("function_mode", "TorchFunctionMode"), ("dispatch_mode", "TorchDispatchMode")):
        made = re.fullmatch(r"(\w+)\(\)", assigned.get(name, ""))
        assert made and base in bases.get(made.group(1), []), f"spaces' {name} is no longer a {base}: {HINT}"
    [enter] = functions(module, "enter_mode")
    calls = [ast.unparse(s.value) for s in enter.body if isinstance(s, ast.Expr)]
    assert calls == ["function_mode.__enter__()", "dispatch_mode.__enter__()"], (
        f"spaces enters its torch modes differently now ({calls}): {HINT}"
    )
    from torch.overrides import _get_current_function_mode_stack

    assert inspect.isfunction(_get_current_function_mode_stack) and internals.active_function_modes() == []


def test_a_quota_refusal_still_says_the_seconds_asked_and_left() -> None:
    """quota.gpu_unavailable reads spaces' refusal: a gr.Error with a title, its message giving
    "(Ns requested vs. Ms left)" and "Try again in H:MM:SS"."""
    text = source("zero/client.py")
    assert 'f"({requested}s requested vs. {res.left}s left). "' in text, (
        f"spaces' quota refusal no longer says the seconds requested and left: {HINT}"
    )
    assert 'f"Try again in {res.wait}. "' in text, f"spaces' quota refusal no longer says when: {HINT}"
    sample = "You have exceeded your ZeroGPU quota (72s requested vs. 40s left). Try again in 0:10:00. "
    assert internals.REFUSAL_ASKED_LEFT.search(sample) and internals.REFUSAL_WAIT.search(sample)
    [error] = functions(tree("zero/gradio.py"), "error")
    assert "'title': title" in ast.unparse(error), f"spaces' errors no longer carry a title: {HINT}"


@pytest.mark.parametrize(
    "name", ["node_configs", "forget_decorated", "torch_modes", "end_workers", "is_refusal"]
)
def test_every_internal_is_listed_in_the_design_notes(name: str) -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = design.split("## Patched internals", 1)[-1]
    assert "## Patched internals" in design and f"`{name}`" in section, f"docs/DESIGN.md does not list {name}"
