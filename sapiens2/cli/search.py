"""``sapiens2 search PHOTO --index INDEX [-k 10] [--by appearance|pose] [--json]``: the people of
INDEX most like the one in PHOTO (:func:`sapiens2.search.find_similar`), one line each (rank,
score, person, source), or a JSON list."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import Sapiens2Error

NAME = "search"
HELP = "Find the people of an index (made by 'sapiens2 index') most like the person in a photo."


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("photo", metavar="PHOTO", help="the query photo: a path or a URI")
    parser.add_argument("--index", "-i", required=True, help="INDEX, as given to 'sapiens2 index --out'")
    parser.add_argument("-k", type=int, default=10, help="how many people (default %(default)s)")
    parser.add_argument(
        "--by", choices=("appearance", "pose"), default="appearance", help="default: %(default)s"
    )
    parser.add_argument("--person", type=int, help="which person of PHOTO, from 0 (default: the largest)")
    parser.add_argument(
        "--no-mirror", action="store_true", help="by pose: do not also match the mirrored pose"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of lines")


def run(args: argparse.Namespace) -> int:
    from ..search import find_similar

    try:
        hits = find_similar(args.photo, args.index, by=args.by, k=args.k, person=args.person,
                            mirror=not args.no_mirror)  # fmt: skip
    except (Sapiens2Error, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([h.as_dict() for h in hits], indent=1))
    else:
        for h in hits:
            who = "whole photo" if h.person < 0 else f"person {h.person}"
            box = " ".join(f"{v:.0f}" for v in h.box)
            print(f"{h.rank:>3}  {h.score:.4f}  {who}  [{box}]  {h.source}")
    return 0
