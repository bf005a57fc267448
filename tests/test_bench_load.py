"""bench/load.py's check of Gradio's cache cleaner (``delete_cache``) on made-up listings: it
passes a cleaner that keeps the promise (files past the age gone, younger and kept ones stay) and
fails one that deletes too little, too much, or the app's kept copies."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from load import judge_cache  # noqa: E402

AGE = 20.0
NOW = 1_000_000.0
KEPT = {Path("c/example.jpg")}
#: the first listing: kept copies from start-up, three files past the age, two fresh ones
FIRST = {
    Path("c/example.jpg"): NOW - 300,
    Path("c/old1.webp"): NOW - 40,
    Path("c/old2.png"): NOW - 25,
    Path("c/old3.jpg"): NOW - 80,
    Path("c/new1.webp"): NOW - 2,
    Path("c/new2.png"): NOW - 1,
}
LATER = NOW + 10  # the second listing, after one cleaner run


def second(*without: str) -> dict[Path, float]:
    return {p: c for p, c in FIRST.items() if p.name not in without}


def test_a_working_cleaner_passes_though_files_remain() -> None:
    # what remains (the example's copy, the fresh files) is what must remain
    verdict = judge_cache(KEPT, FIRST, NOW, second("old1.webp", "old2.png", "old3.jpg"), LATER, AGE)
    assert verdict.ok and len(verdict.old) == 3 and len(verdict.young) == 2


def test_a_cleaner_that_leaves_an_old_file_fails() -> None:
    verdict = judge_cache(KEPT, FIRST, NOW, second("old1.webp", "old3.jpg"), LATER, AGE)
    assert not verdict.ok and verdict.old_left == [Path("c/old2.png")]


def test_a_cleaner_that_deletes_a_young_file_or_a_kept_copy_fails() -> None:
    too_much = judge_cache(
        KEPT, FIRST, NOW, second("old1.webp", "old2.png", "old3.jpg", "new1.webp"), LATER, AGE
    )
    assert not too_much.ok and too_much.young_gone == [Path("c/new1.webp")]
    kept = judge_cache(
        KEPT, FIRST, NOW, second("old1.webp", "old2.png", "old3.jpg", "example.jpg"), LATER, AGE
    )
    assert not kept.ok and kept.kept_gone == [Path("c/example.jpg")]


def test_a_copy_handed_out_again_is_young_and_near_the_age_is_not_judged() -> None:
    listing = second("old1.webp", "old3.jpg")
    listing[Path("c/old2.png")] = NOW + 5  # reused since: Gradio touched it, so its clock restarted
    assert judge_cache(KEPT, FIRST, NOW, listing, LATER, AGE).ok
    # a file 19.5 s old at the first listing may be deleted or not: neither counts
    edge = {**FIRST, Path("c/edge.png"): NOW - 19.5}
    assert judge_cache(KEPT, edge, NOW, second("old1.webp", "old2.png", "old3.jpg"), LATER, AGE).ok


def test_listings_that_test_nothing_do_not_pass() -> None:
    fresh_only = {p: c for p, c in FIRST.items() if p.name.startswith(("new", "example"))}
    assert not judge_cache(KEPT, fresh_only, NOW, fresh_only, LATER, AGE).ok  # no old file to delete
    stale = {p: c for p, c in FIRST.items() if not p.name.startswith("new")}
    assert not judge_cache(
        KEPT, stale, NOW, {Path("c/example.jpg"): NOW - 300}, LATER, AGE
    ).ok  # no young one
