"""Every Python and shell block of README.md and docs/*.md runs, as a new user would paste it,
in a scratch project of its own; or it is marked as an illustration.

The rules (the README's "Development" section states them too):

- A block whose line before the fence is ``<!-- illustration -->`` is not run.
- A Python block whose first line is a comment naming a file (``# myapp/jobs.py``,
  ``# settings.py``, ``# urls.py``) is that file's content, added to the scratch project's file of
  that name. Such a block defines and never calls at import: the project starts (``manage.py
  check``, which imports every ``jobs.py``) with no query run and no job written.
- Any other Python block runs in ``manage.py shell``, after ``from app.module import *`` of every
  module block of the same document before it; each starts afresh, so a block is self-contained
  beside the modules.
- A shell block's ``python manage.py …`` commands run in the scratch project, each to its end
  (a command that serves until stopped gets SIGTERM after a few seconds, and must then exit 0);
  ``pip install`` lines name the distribution (tests/unit/test_distribution_name.py checks them);
  ``python3 scripts/dev.py`` lines are what CI itself runs. A block with anything else (``curl``,
  ``kubectl``, ``uvicorn``) must be marked as an illustration: the tests of that feature run it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from django.db import connection

from tests.conftest import ROOT, database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ILLUSTRATION = "<!-- illustration -->"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MODULE_HEADER = re.compile(r"^# ([\w/]+\.py)\b")
#: Commands that serve until stopped: they get this long, then SIGTERM.
SERVES_FOR = 4.0
#: Apps a module block may live in, besides the project's own settings.py and urls.py.
PROJECT_FILES = {"settings.py", "urls.py"}


@dataclasses.dataclass
class Block:
    document: Path
    line: int
    language: str
    text: str
    illustration: bool

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def module(self) -> str | None:
        match = MODULE_HEADER.match(self.text)
        return match[1] if match and self.language == "python" else None


def blocks(document: Path) -> Iterator[Block]:
    text = document.read_text()
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        yield Block(document, line, match[1], match[2], before.strip() == ILLUSTRATION)


def runnable(document: Path) -> list[Block]:
    return [
        b
        for b in blocks(document)
        if not b.illustration and b.language in {"python", "bash", "sh", "shell"}
    ]


def executes(block: Block) -> bool:
    """Whether running the block runs anything here: every Python block does, and a shell block
    with a command besides ``pip install`` and ``python3 scripts/dev.py`` (checked elsewhere)."""
    if block.language == "python":
        return True
    return any(not checked_elsewhere(words) for words in shell_commands(block.text))


def checked_elsewhere(words: list[str]) -> bool:
    return words[:2] == ["pip", "install"] or words[:2] == ["python3", "scripts/dev.py"]


def name(document: Path) -> str:
    return str(document.relative_to(ROOT))


SETTINGS = """\
import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "scratch"
DEBUG = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobs",
    *{apps},
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {{
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {{
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        }},
    }}
]
ROOT_URLCONF = "urls"
DATABASES = {{"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
# The queues the docs' examples name.
JOBS_QUEUES = ["default", "reports", "imports", "gpu"]
"""

URLS = """\
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]
"""

MANAGE = """\
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""


class Scratch:
    """A project of its own for one document: settings, urls, and the apps its blocks name."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root = root
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "settings",
            "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]),
            "PYTHONWARNINGS": "error::RuntimeWarning",  # database access at app start
        }
        self.apps: list[str] = []
        self.modules: list[str] = []
        self.extra = {"settings.py": "", "urls.py": ""}

    def add_module(self, block: Block) -> None:
        path = block.module
        assert path is not None
        if path in PROJECT_FILES:
            self.extra[path] += f"\n# {block.where}\n{block.text}"
        else:
            app = path.split("/")[0]
            package = self.root / app
            package.mkdir(exist_ok=True)
            (package / "__init__.py").touch()
            for parent in Path(path).parents:
                if str(parent) != ".":
                    (self.root / parent).mkdir(exist_ok=True)
                    (self.root / parent / "__init__.py").touch()
            with (self.root / path).open("a") as out:
                out.write(f"\n# {block.where}\n{block.text}")
            if app not in self.apps:
                self.apps.append(app)
            module = path.removesuffix(".py").replace("/", ".")
            if module not in self.modules:
                self.modules.append(module)
        self.write()

    def write(self) -> None:
        (self.root / "settings.py").write_text(
            SETTINGS.format(apps=repr(self.apps)) + self.extra["settings.py"]
        )
        (self.root / "urls.py").write_text(URLS + self.extra["urls.py"])
        (self.root / "manage.py").write_text(MANAGE)

    def run(self, args: list[str], where: str, *, serves: bool = False) -> str:
        process = subprocess.Popen(
            [sys.executable, *args],
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = process.communicate(timeout=SERVES_FOR if serves else 120)
        except subprocess.TimeoutExpired:
            if not serves:
                os.killpg(process.pid, signal.SIGKILL)
                out, _ = process.communicate()
                raise AssertionError(f"{where}: {shlex.join(args)} did not end:\n{out}") from None
            process.send_signal(signal.SIGTERM)
            try:
                out, _ = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                out, _ = process.communicate()
                raise AssertionError(
                    f"{where}: {shlex.join(args)} ignored SIGTERM:\n{out}"
                ) from None
        assert process.returncode == 0, (
            f"{where}: {shlex.join(args)} exited {process.returncode}:\n{out}"
        )
        return out


def shell_commands(text: str) -> Iterator[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield shlex.split(line, comments=True)


#: manage.py commands that serve until stopped, unless told to end by these options.
SERVING = {
    "runjobworker": {"--burst", "--max-jobs", "--help"},
    "runjobscheduler": {"--help"},
    "runserver": set(),
    "reapjobs": None,  # serves only with --loop
    "jobstats": None,  # serves only with --watch
}


def serves(argv: list[str]) -> bool:
    command = argv[1] if len(argv) > 1 else ""
    if command == "reapjobs":
        return "--loop" in argv
    if command == "jobstats":
        return "--watch" in argv
    if command == "jobs":
        return "--follow" in argv or "-f" in argv
    enders = SERVING.get(command)
    if enders is None:
        return False
    return not any(a.split("=")[0] in enders for a in argv)


def run_shell_block(scratch: Scratch, block: Block) -> None:
    for words in shell_commands(block.text):
        if checked_elsewhere(words):
            continue
        if words[0] in {"python", "python3"} and words[1:2] == ["manage.py"]:
            redirect = [w for w in words if w in {">", ">>", "|"}]
            assert not redirect, f"{block.where}: run with its output redirected: mark it"
            scratch.run(words[1:], block.where, serves=serves(words[1:]))
            continue
        raise AssertionError(
            f"{block.where}: `{shlex.join(words)}` is not run by this test; mark the block with "
            f"{ILLUSTRATION} on the line before it if a test of its own covers it"
        )


#: Imports a module with every query refused: a module block defines, and never calls.
IMPORT_WITHOUT_QUERIES = """\
import importlib
from django.db import connections

def refuse(*args, **kwargs):
    raise RuntimeError("{module} runs a query at import: a module defines, and never calls")

with connections["default"].execute_wrapper(refuse):
    importlib.import_module("{module}")
"""


def framework(text: str) -> str:
    """Django 5.2 has the Tasks framework as the django-tasks backport, under another name."""
    if django.VERSION < (6, 0):
        return text.replace("from django.tasks import", "from django_tasks import")
    return text


def run_python_block(scratch: Scratch, block: Block) -> None:
    block = dataclasses.replace(block, text=framework(block.text))
    if block.module is not None:
        scratch.add_module(block)
        # The project starts (and imports every jobs.py) with no query at app start: a
        # RuntimeWarning, an error here.
        before = _jobs()
        scratch.run(["manage.py", "check", "--fail-level", "ERROR"], block.where)
        if block.module not in PROJECT_FILES:
            module = block.module.removesuffix(".py").replace("/", ".")
            script = IMPORT_WITHOUT_QUERIES.format(module=module)
            scratch.run(["manage.py", "shell", "--no-startup", "-c", script], block.where)
        assert _jobs() == before, f"{block.where}: the module enqueued at import"
        return
    prelude = "".join(f"from {module} import *\n" for module in scratch.modules)
    script = prelude + textwrap.dedent(block.text)
    scratch.run(["manage.py", "shell", "--no-startup", "-c", script], block.where)


def _jobs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_jobs_job")
        return int(cursor.fetchone()[0])


#: The documents with no block that this test runs (prose, SQL, configuration, illustrations):
#: not run below, where they would pass with nothing checked. A document that gains its first
#: runnable block, or loses its last, fails the test of this list until the list says so.
WITHOUT_RUNNABLE_BLOCKS = {
    "docs/admin.md",
    "docs/architecture.md",
    "docs/benchmarks.md",
    "docs/connections.md",
    "docs/production.md",
}
RUN = [d for d in DOCUMENTS if any(executes(b) for b in runnable(d))]


def test_the_documents_without_runnable_blocks_are_the_listed_ones() -> None:
    assert {name(d) for d in DOCUMENTS if d not in RUN} == WITHOUT_RUNNABLE_BLOCKS
    assert RUN, "no document has a block to run"


@pytest.mark.parametrize("document", RUN, ids=name)
def test_every_block_runs_or_is_an_illustration(document: Path, tmp_path: Path) -> None:
    scratch = Scratch(tmp_path, database_url())
    scratch.write()
    for block in runnable(document):
        if block.language == "python":
            run_python_block(scratch, block)
        else:
            run_shell_block(scratch, block)


def test_the_block_rules_hold_for_a_bad_block(tmp_path: Path) -> None:
    """The runner fails on a module that enqueues at import, and on an unmarked curl block."""
    scratch = Scratch(tmp_path, database_url())
    scratch.write()
    module = Block(
        ROOT / "README.md",
        1,
        "python",
        "# shop/jobs.py\nfrom django_jobs import job\n\n\n@job\ndef f(): ...\n\n\nf.enqueue()\n",
        False,
    )
    with pytest.raises(AssertionError):
        run_python_block(scratch, module)
    curl = Block(ROOT / "README.md", 1, "bash", "curl -sS http://app/\n", False)
    with pytest.raises(AssertionError, match="illustration"):
        run_shell_block(scratch, curl)
