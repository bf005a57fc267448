"""The visitor's page and the docs agree with the task registry: the README's front matter (Hub
preload and model list), its task list and the endpoint lists of README.md and docs/USAGE.md
name exactly the tasks the public Space shows (those whose weights are on the Hub)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2.models import hub_cache  # noqa: E402
from sapiens2.models.zoo import DETECTOR, TASKS, is_v1  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402

README = (ROOT / "README.md").read_text(encoding="utf-8")
USAGE = (ROOT / "docs" / "USAGE.md").read_text(encoding="utf-8")
#: endpoints that are not tasks: "All tasks", the video tab's three
NOT_TASKS = {"/all", "/video", "/video_plan", "/motion"}


def public_tasks() -> list[registry.Task]:
    """What the public Space shows: the tasks whose weights are on the Hub."""
    return [t for t in registry.declared().values() if t.spec.on_hub]


def front_matter_list(key: str) -> list[str]:
    block = README.split("---", 2)[1]
    match = re.search(rf"^{key}:\n((?:  - .*\n)+)", block, re.M)
    assert match, f"README front matter has no {key} list"
    return [line[4:].strip() for line in match.group(1).splitlines()]


def endpoints_in(text: str, lead: str) -> set[str]:
    """The backticked `/names` of the paragraph that starts with ``lead``."""
    start = text.index(lead)
    paragraph = text[start : text.find("\n\n", start)]
    return set(re.findall(r"`(/[a-z_]+)`", paragraph))


def expected_endpoints() -> set[str]:
    tasks = public_tasks()
    compare = {f"/{t.compare.api_name}" for t in tasks if t.compare}
    later = {f"/{o.api_name}" for t in tasks for o in t.on_demand}
    return {f"/{t.api_name}" for t in tasks} | compare | later


def test_front_matter_preload_is_the_zoo_default_of_every_hub_task() -> None:
    assert front_matter_list("preload_from_hub") == hub_cache.preload_from_hub()


def test_front_matter_models_are_every_hub_checkpoint_and_the_detector() -> None:
    # Sapiens2's checkpoints; the Sapiens v1 repos (``v1-*`` sizes) are named in the About section
    want = {spec.repo_id(s) for spec in TASKS.values() if spec.on_hub for s in spec.sizes if not is_v1(s)}
    assert set(front_matter_list("models")) == want | {DETECTOR.repo_id}
    assert not any(not s.on_hub and f"sapiens2-{s.name}-" in README for s in TASKS.values())


def test_readme_lists_the_public_tabs_in_order() -> None:
    bullets = re.findall(r"^- \*\*(.+?)\*\*:", README, re.M)
    assert bullets == [t.tab for t in public_tasks()] + ["Video", "Live"]


def test_endpoint_lists_name_every_public_task() -> None:
    readme = endpoints_in(README, "Every tab is an endpoint")
    assert readme - NOT_TASKS == expected_endpoints()
    usage = endpoints_in(USAGE, "Every task has a stable API name")
    assert usage - NOT_TASKS == expected_endpoints()
