"""Every Python and shell block of README.md and docs/*.md runs exactly as a user pastes it,
in a scratch project of its own; or it is marked as an illustration.

The scratch project is what a user has: the files ``django-admin startproject myproject``
makes, ``"django_jobs"`` added to INSTALLED_APPS as the README's install section says, and
DATABASES pointing at the test database (the environment). Nothing else: no import, setting or
translation is added to a block, so a block that needs one says so itself.

The rules (the README's "Development" section states them too):

- A block whose line before the fence is ``<!-- illustration -->`` is not run.
- A Python block whose first line is a comment naming a file (``# myapp/jobs.py``,
  ``# settings.py``, ``# urls.py``) is that file's content, added to the end of the scratch
  project's file of that name (settings.py and urls.py are startproject's; the app of
  ``myapp/…`` is made by ``manage.py startapp myapp`` and added to INSTALLED_APPS). Such a block
  defines and never calls at import: the project starts (``manage.py check``, which imports
  every ``jobs.py``) with no query run and no job written.
- Any other Python block runs in ``manage.py shell``, on its own, with none of the shell's
  automatic imports: it imports every name it uses, the module blocks' too.
- A shell block's ``python manage.py …`` commands run in the scratch project, each to its end
  (a command that serves until stopped gets SIGTERM a few seconds after its first line of
  output, and must then exit 0);
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
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import django
import environ
import pytest
from django.db import connection

from tests.conftest import ROOT, database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ILLUSTRATION = "<!-- illustration -->"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MODULE_HEADER = re.compile(r"^# ([\w/]+\.py)\b")
#: Commands that serve until stopped: once started (their first line of output, which a busy
#: machine may take this long to reach), they serve this long, then get SIGTERM.
STARTS_WITHIN = 120.0
SERVES_FOR = 4.0
#: The module blocks that are the project's own files, not an app's.
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


#: The project a scratch project is, as ``django-admin startproject`` names it.
PROJECT = "myproject"

#: What the README's install section has the user add to startproject's settings.py.
INSTALL = """
# README.md, "Install into your project"
INSTALLED_APPS += ["django_jobs"]
"""

#: The test database instead of startproject's SQLite file: the scratch project's environment
#: (where its database is), not a repair of any block.
ENVIRONMENT = """
# The test database (environment, not a repair: startproject's DATABASES is a SQLite file).
DATABASES = {{"default": {database!r}}}
"""


class Scratch:
    """A project of its own for one document, as a user has it: what ``django-admin
    startproject`` made, with what the README's install section adds, on the test database.
    A module block's app is made by ``manage.py startapp`` and added to INSTALLED_APPS, as the
    README says a jobs.py lives in an installed app; module blocks are added to their files."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root = root
        # Nothing of the test process's Django: manage.py names the project's settings.
        outer = {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH"}
        self.env = {k: v for k, v in os.environ.items() if k not in outer}
        self.env["PYTHONWARNINGS"] = "error::RuntimeWarning"  # database access at app start
        self.apps: list[str] = []
        self.run(["-m", "django", "startproject", PROJECT, str(root)], "startproject")
        database = environ.Env.db_url_config(database_url)
        with self.path("settings.py").open("a") as out:
            out.write(INSTALL + ENVIRONMENT.format(database=database))

    def path(self, header: str) -> Path:
        """The file a module block's header names: settings.py and urls.py are the project's."""
        return self.root / (f"{PROJECT}/{header}" if header in PROJECT_FILES else header)

    def add_module(self, block: Block) -> None:
        header = block.module
        assert header is not None
        app = header.split("/")[0]
        if header not in PROJECT_FILES and app != PROJECT and app not in self.apps:
            self.run(["manage.py", "startapp", app], block.where)
            with self.path("settings.py").open("a") as out:
                out.write(f'\n# python manage.py startapp {app}\nINSTALLED_APPS += ["{app}"]\n')
            self.apps.append(app)
        path = self.path(header)
        for parent in path.relative_to(self.root).parents:
            if str(parent) != ".":
                (self.root / parent).mkdir(exist_ok=True)
                (self.root / parent / "__init__.py").touch()
        with path.open("a") as out:
            out.write(f"\n# {block.where}\n{block.text}")

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
        if serves:
            return self._serve(process, args, where)
        try:
            out, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            raise AssertionError(f"{where}: {shlex.join(args)} did not end:\n{out}") from None
        assert process.returncode == 0, (
            f"{where}: {shlex.join(args)} exited {process.returncode}:\n{out}"
        )
        return out

    def _serve(self, process: subprocess.Popen[str], args: list[str], where: str) -> str:
        """Let a serving command start (its first line of output: Django is up, its signal
        handlers are in place), serve for :data:`SERVES_FOR` seconds, then SIGTERM it: it must
        exit 0."""
        assert process.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + STARTS_WITHIN
        while not lines and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not lines and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise AssertionError(f"{where}: {shlex.join(args)} printed nothing in {STARTS_WITHIN}s")
        try:
            process.wait(timeout=SERVES_FOR)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                reader.join(10)
                out = "".join(lines)
                raise AssertionError(
                    f"{where}: {shlex.join(args)} ignored SIGTERM:\n{out}"
                ) from None
        reader.join(10)
        out = "".join(lines)
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


#: Runs a block in the shell's place, with nothing in its namespace (not the shell command's
#: globals, nor the models Django's shell imports by itself): it imports what it uses.
IN_SHELL = "exec(compile({text!r}, {where!r}, 'exec'), {{'__name__': '__main__'}})"


def run_python_block(scratch: Scratch, block: Block) -> None:
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
    script = IN_SHELL.format(text=textwrap.dedent(block.text), where=block.where)
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
    for block in runnable(document):
        if block.language == "python":
            run_python_block(scratch, block)
        else:
            run_shell_block(scratch, block)


def test_the_block_rules_hold_for_a_bad_block(tmp_path: Path) -> None:
    """The runner fails on a module that enqueues at import, and on an unmarked curl block."""
    scratch = Scratch(tmp_path, database_url())
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


def snippet(text: str) -> Block:
    """A Python block, as if of the README."""
    return Block(ROOT / "README.md", 1, "python", text, False)


SHOP_JOBS = "# shop/jobs.py\nfrom django_jobs import job\n\n\n@job\ndef f(): ...\n"


def test_a_block_gets_no_import_it_does_not_write(tmp_path: Path) -> None:
    """A Python block runs as pasted: a module block's names, and the models that Django's shell
    imports by itself, are there only when the block imports them."""
    scratch = Scratch(tmp_path, database_url())
    run_python_block(scratch, snippet(SHOP_JOBS))
    with pytest.raises(AssertionError, match="NameError: name 'f' is not defined"):
        run_python_block(scratch, snippet("print(f.name)\n"))
    run_python_block(scratch, snippet("from shop.jobs import f\n\nprint(f.name)\n"))
    with pytest.raises(AssertionError, match="NameError: name 'User' is not defined"):
        run_python_block(scratch, snippet("print(User.objects.count())\n"))


def test_the_scratch_project_is_what_startproject_made(tmp_path: Path) -> None:
    """Its settings are startproject's with django_jobs installed (and the apps of module
    blocks), and its urls.py imports only what startproject's does."""
    scratch = Scratch(tmp_path, database_url())
    run_python_block(scratch, snippet(SHOP_JOBS))
    settings = """\
from django.conf import settings

assert settings.ALLOWED_HOSTS == [], settings.ALLOWED_HOSTS
assert settings.ROOT_URLCONF == "myproject.urls", settings.ROOT_URLCONF
assert settings.INSTALLED_APPS[-2:] == ["django_jobs", "shop"], settings.INSTALLED_APPS
assert not hasattr(settings, "JOBS_QUEUES")
"""
    run_python_block(scratch, snippet(settings))
    urls = '# urls.py\nurlpatterns += [path("jobs/", include("django_jobs.api.urls"))]\n'
    with pytest.raises(AssertionError, match="NameError: name 'include' is not defined"):
        run_python_block(scratch, snippet(urls))


def test_a_block_is_not_translated_for_the_django_it_runs_on(tmp_path: Path) -> None:
    """``from django.tasks import`` runs as written: on Django 5.2, which has no django.tasks,
    it fails (the docs import from django_tasks there)."""
    scratch = Scratch(tmp_path, database_url())
    tasks = snippet("# shop/tasks.py\nfrom django.tasks import task\n")
    if django.VERSION >= (6, 0):
        run_python_block(scratch, tasks)
    else:
        with pytest.raises(AssertionError, match=r"No module named 'django\.tasks'"):
            run_python_block(scratch, tasks)
