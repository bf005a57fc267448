"""The ``sapiens2`` command (also ``python -m sapiens2``).

``sapiens2 TASK INPUT...`` runs one task over images, folders and clips (:mod:`.tasks`); further
commands (each a module of this package with ``NAME``, ``HELP``, ``add(parser)`` and
``run(args) -> int``) are listed in :data:`COMMANDS`. Exit code 0 when at least one input
succeeded, 1 otherwise, 2 for a malformed command line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from ..runtime import heap
from . import tasks

#: Modules of this package that add a command beside the per-task ones.
COMMANDS: tuple[str, ...] = ("batch", "motion_cmd", "export_cmd", "index", "search")


def prog_name() -> str:
    """``sapiens2`` when run as the installed command, else ``python -m sapiens2``."""
    return "sapiens2" if Path(sys.argv[0]).stem == "sapiens2" else "python -m sapiens2"


def _commands() -> dict[str, ModuleType]:
    modules = [importlib.import_module(f"{__name__}.{name}") for name in COMMANDS]
    return {m.NAME: m for m in modules}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name(),
        description="Run a Sapiens2 task on images and folders; write the export files per image.",
    )
    sub = p.add_subparsers(dest="task", metavar="TASK", required=True, help="what to compute")
    tasks.add_commands(sub)
    for name, module in _commands().items():
        module.add(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    heap.configure()  # a photo's temporaries reuse pages already touched (sapiens2/runtime/heap.py)
    # Say on stderr when weights are being downloaded (a first use can take minutes); warnings too.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("sapiens2.models.weights").setLevel(logging.INFO)
    command = _commands().get(args.task)
    return command.run(args) if command is not None else tasks.run(args)


__all__ = ["COMMANDS", "build_parser", "main"]
