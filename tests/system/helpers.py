"""What the system tests share that is not a fixture (their shared fixtures are in
``tests/system/conftest.py``): the workers' short timings, the reaper on the same terms, the job
bodies' journals, and the steps of the console's browser tests.

Test modules import from here, never from one another.

Screenshots: the browser tests write theirs (the console's to ``docs/images/``, under the names
docs/admin.md uses, ``console-<page>-<width>.png``; the others to ``artifacts/screenshots/``) only
when the environment asks for them with ``DJANGO_JOBS_SCREENSHOTS=1``. A plain run writes none,
and still checks that each page fits.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from django.test.utils import override_settings

from django_jobs.reaper import ReapReport, reap_pass
from tests.conftest import ROOT, wait_for

# ---------------------------------------------------------------------- workers' timings

#: A worker's environment for the tests that kill, stop or cut off workers: a heartbeat every
#: 0.5 s, gone after 2 s without one, 1 s of grace before a kill, a poll every 0.2 s. A module
#: whose workers need other values says so beside its use (``{**FAST_WORKER, ...}``).
FAST_WORKER = {
    "JOBS_HEARTBEAT_INTERVAL": "0.5",
    "JOBS_WORKER_TIMEOUT": "2",
    "JOBS_KILL_GRACE": "1",
    "JOBS_POLL_INTERVAL": "0.2",
}
#: The environment of the HTTP API's server and of its workers (``runjobworker --api``): as
#: :data:`FAST_WORKER`, gone after 3 s without a heartbeat.
FAST_API_WORKER = {**FAST_WORKER, "JOBS_WORKER_TIMEOUT": "3"}
#: The reaper of the test process, on :data:`FAST_WORKER`'s terms.
fast_reaper = override_settings(JOBS_WORKER_TIMEOUT=2, JOBS_HEARTBEAT_INTERVAL=0.5)


def reap_once_stale() -> ReapReport:
    """Reap until a pass acts: once the worker's last heartbeat is older than
    JOBS_WORKER_TIMEOUT (2 s under ``fast_reaper``). That pass's report."""
    return wait_for(lambda: (passed := reap_pass()).actions and passed, timeout=15, interval=0.2)


# ---------------------------------------------------------------------- job bodies' journals


def journal(path: Path) -> list[dict[str, Any]]:
    """The lines a job body appended to ``path`` (JSON each), oldest first."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@dataclasses.dataclass
class Execution:
    job: int
    pid: int
    attempt: int
    start: float
    last: float
    ended: bool


def executions(path: Path) -> list[Execution]:
    """Each run of a job body, from its journal: when it started and when it was last seen."""
    runs: dict[tuple[int, int, float], Execution] = {}
    current: dict[tuple[int, int], Execution] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        key = (entry["job"], entry["pid"])
        if entry["event"] == "start":
            run = Execution(
                entry["job"], entry["pid"], entry["attempt"], entry["t"], entry["t"], False
            )
            runs[(entry["job"], entry["pid"], entry["t"])] = current[key] = run
        else:
            run = current[key]
            run.last = entry["t"]
            run.ended = entry["event"] == "end"
    return list(runs.values())


def overlaps(runs: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of runs of one job that were alive at the same time."""
    found = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a.job == b.job and a.start <= b.last and b.start <= a.last:
                found.append((a, b))
    return found


# ---------------------------------------------------------------------- the browser tests

#: The password of the browser tests' users (the ``operator`` fixture's, and any a test makes).
PASSWORD = "correct horse battery"

#: Where the console's screenshots go: the images docs/admin.md shows.
IMAGES = ROOT / "docs" / "images"
#: Where the other browser tests' screenshots go (not tracked).
SHOTS = ROOT / "artifacts" / "screenshots"

#: The widths every console page is checked at: a laptop, and a desktop monitor.
WIDTHS = (1280, 1920)


def screenshots_wanted() -> bool:
    """Whether this run writes screenshots: only when ``DJANGO_JOBS_SCREENSHOTS=1`` asks."""
    return os.environ.get("DJANGO_JOBS_SCREENSHOTS") == "1"


def screenshot(target: Any, path: Path, **options: Any) -> None:
    """Write the screenshot of ``target`` (a page, or an element's locator) to ``path``, when
    :func:`screenshots_wanted`; nothing otherwise."""
    if not screenshots_wanted():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    target.screenshot(path=str(path), **options)


#: Elements that are cut off: content wider than their box while their overflow hides or
#: scrolls it, a table wider than its container, and any element whose right edge lies past the
#: window. Scrolling blocks that are
#: meant to scroll (logs, JSON, tracebacks: ``pre`` and ``.dj-scroll``) are left out.
_CLIPPED = """
() => {
  const wide = window.innerWidth;
  const out = [];
  for (const e of document.querySelectorAll('#container *')) {
    if (e.closest('pre, .dj-scroll, .visually-hidden, script, style, template, [hidden]')) continue;
    const style = getComputedStyle(e);
    if (style.display === 'none' || style.visibility === 'hidden') continue;
    const box = e.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    const clips = style.overflowX !== 'visible' || style.textOverflow === 'ellipsis';
    const parent = e.parentElement;
    const inner = parent.getBoundingClientRect().right
                  - parseFloat(getComputedStyle(parent).paddingRight || '0');
    if (clips && e.scrollWidth > e.clientWidth + 1) {
      out.push('clipped: ' + e.outerHTML.slice(0, 120));
    } else if (e.tagName === 'TABLE' && box.right > inner + 1) {
      out.push('wider than its container (' + Math.round(box.right) + ' > ' + Math.round(inner)
               + '): ' + e.outerHTML.slice(0, 120));
    } else if (box.right > wide + 1) {
      out.push('past the window (' + Math.round(box.right) + ' > ' + wide + '): '
               + e.outerHTML.slice(0, 120));
    }
  }
  if (document.documentElement.scrollWidth > wide + 1) {
    out.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + wide);
  }
  return out.slice(0, 20);
}
"""


def clipped(page: Any) -> list[str]:
    """What the page cuts off or pushes past the window's right edge, as short descriptions;
    empty when everything fits."""
    return list(page.evaluate(_CLIPPED))


def assert_fits(page: Any) -> None:
    """Fail naming each element that is clipped or sticks out of the window."""
    problems = clipped(page)
    assert problems == [], "\n".join(problems)


def shoot(page: Any, name: str, width: int) -> None:
    """Check that the page fits; then, when screenshots are wanted, write
    ``docs/images/console-<name>-<width>.png``."""
    assert_fits(page)
    if not screenshots_wanted():
        return
    # From the top: the admin's sidebar is sticky, and would show where the page was scrolled.
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, IMAGES / f"console-{name}-{width}.png", full_page=True)


def open_page(browser: Any, live_server: Any, width: int, username: str = "operator") -> Any:
    """A logged-in page of a new browser context ``width`` px wide (900 px high). The user's
    password is :data:`PASSWORD`."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    return page
