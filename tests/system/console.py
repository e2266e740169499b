"""Shared steps of the console's browser tests: log in, take the screenshots that docs/admin.md
shows, and measure in the page that nothing is cut off.

The screenshots are written to ``docs/images/`` under the names docs/admin.md uses
(``console-<page>-<width>.png``).
"""

from __future__ import annotations

from typing import Any

from tests.conftest import ROOT

IMAGES = ROOT / "docs" / "images"

#: The widths every console page is checked at: a laptop, and a desktop monitor.
WIDTHS = (1280, 1920)

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
    """Check that the page fits, then write ``docs/images/console-<name>-<width>.png``."""
    assert_fits(page)
    IMAGES.mkdir(parents=True, exist_ok=True)
    # From the top: the admin's sidebar is sticky, and would show where the page was scrolled.
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(IMAGES / f"console-{name}-{width}.png"), full_page=True)


def open_page(browser: Any, live_server: Any, width: int, username: str = "operator") -> Any:
    """A logged-in page of a new browser context ``width`` px wide (900 px high). The user's
    password is ``correct horse battery``."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct horse battery")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    return page
