"""``sapiens2 index INPUT --out INDEX [--by appearance,pose]``: a collection's people into a
searchable index (:mod:`sapiens2.search.indexing`). Every INPUT, engine and run option of
``sapiens2 batch`` applies; INPUT may also be an earlier ``sapiens2 batch`` OUT (nothing is
computed again). A rerun adds only the new sources."""

from __future__ import annotations

import argparse
import copy
import sys

from ..errors import Sapiens2Error
from . import batch

NAME = "index"
HELP = (
    "Index the people of a collection (or of a sapiens2 batch OUT) by appearance and/or pose into "
    "INDEX, searchable with 'sapiens2 search'; a rerun adds only new photos."
)


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--by", default="appearance", metavar="KINDS",
        help="appearance (each person's backbone features; --no-per-person: one CLS vector a photo), "
        "pose (308 keypoints), or appearance,pose (default: %(default)s)",
    )  # fmt: skip
    batch.add_run_options(
        parser, "INDEX: a folder or URI (INDEX/vectors: LanceDB tables; INDEX/batch: the rows)"
    )
    for action in parser._actions:  # the batch flag's help says its default there, which index changes
        if action.dest == "per_person":
            action.help = (
                "appearance: one vector per person found (default here); --no-per-person: one a photo"
            )


def run(args: argparse.Namespace) -> int:
    from ..search.indexing import TASK_OF, batch_folder, batch_output, build_index, parse_kinds

    try:
        kinds = parse_kinds(args.by)
        job, engine_options = None, None
        if not batch_output(args.input, kinds):
            run_args = copy.copy(args)
            run_args.tasks, run_args.out = [TASK_OF[k] for k in kinds], batch_folder(args.out)
            if getattr(run_args, "per_person", None) is None:  # appearance per person unless --no-per-person
                run_args.per_person = True
            job, _, engine_options = batch.build_job(run_args)
        summary = build_index(args.input, args.out, by=kinds, job=job, engine=args.engine,
                              engine_options=engine_options)  # fmt: skip
    except (Sapiens2Error, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    failed = 0
    for kind, errors in summary.errors.items():
        failed += len(errors)
        for source, error in errors[:10]:
            print(f"error ({kind}) {source}: {error}", file=sys.stderr)
    print(summary.line())
    added = sum(summary.added.values())
    return 1 if added and failed == added else 0
