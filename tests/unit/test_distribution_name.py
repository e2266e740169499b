"""The distribution's name on the package index, and every install line that names it.

``django-jobs`` on the public package index is an unrelated project, so the distribution is
``django-pgjobs``; the import name and app label stay ``django_jobs``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "django-pgjobs"
#: The project's own packages as a user installs them: the bare name or the name with extras.
PIP_INSTALL = re.compile(r"pip install\s+(?:-[\w-]+\s+)*['\"]?([A-Za-z0-9_.-]+)(\[[^\]]*\])?")
OURS = {"django-jobs", "django_jobs", "django-pgjobs", "django_pgjobs"}


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_distribution_is_named_django_pgjobs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == NAME
    # The extras that build on one another name the distribution too.
    for requirement in (r for extra in project["optional-dependencies"].values() for r in extra):
        name = re.split(r"[\[<>=; ]", requirement, maxsplit=1)[0]
        assert name not in OURS - {NAME}, requirement


def test_every_install_line_names_the_distribution() -> None:
    sources = [*documents(), *sorted((ROOT / "django_jobs").rglob("*.py"))]
    seen = []
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in PIP_INSTALL.finditer(line):
                name = match.group(1)
                if name.lower().replace("_", "-") in {"django-jobs", "django-pgjobs"}:
                    seen.append(f"{path.relative_to(ROOT)}:{number}")
                    assert name == NAME, f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
    assert any(s.startswith("README.md") for s in seen), "the README shows how to install"


def test_the_docs_name_packages_not_registry_addresses() -> None:
    for path in documents():
        text = path.read_text()
        assert "pypi.org" not in text, f"{path.relative_to(ROOT)} links the package index"


def test_the_readme_says_what_the_import_name_is() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"`{NAME}`" in readme and "imported as `django_jobs`" in readme
