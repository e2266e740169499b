"""No module outside django_jobs/store/ holds SQL text: each statement is a named one of
django_jobs/store/sql/, run through a function of the store with the bounded waits of db.py.

Read from the source: string literals (docstrings left out) that start as a statement does, a
driver's ``cursor.execute`` (which would skip ``db.execute``), and the ORM's ways to raw SQL.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_jobs"

#: What SQL text starts with. Upper case only: prose that says "select" or "update" is no SQL.
STATEMENT = re.compile(
    r"^\s*(SELECT\b.*\bFROM\b|UPDATE\s+\S+\s+SET\b|INSERT\s+INTO\b|DELETE\s+FROM\b"
    r"|WITH\s+\w+\s+AS\s*\(|(UN)?LISTEN\s+\S+\s*;?\s*$|NOTIFY\s+\w+\s*(,|;|$)|COPY\s+\w+"
    r"|LOCK\s+TABLE\b|SET\s+\w+\s*(=|TO)\s)",
    re.DOTALL,
)
#: Ways around the store: a driver's execute without db.execute's bounded waits, raw ORM SQL.
AROUND_THE_STORE = re.compile(r"\bcursor\.execute(many)?\(|\.raw\(|\bRawSQL\b|\.extra\(")


def _outside_the_store() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not {"store", "migrations"} & set(path.relative_to(PACKAGE).parts[:-1])
    ]


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def sql_text(source: str) -> list[str]:
    """The string literals of ``source`` that are SQL, and its ways around the store."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    # An f-string's literal parts are read with the f-string, not on their own.
    parts = {id(p) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for p in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                part.value if isinstance(part, ast.Constant) else "{}" for part in node.values
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if id(node) not in docstrings | parts and STATEMENT.match(text):
            found.append(text.strip())
    found += [match.group(0) for match in AROUND_THE_STORE.finditer(source)]
    return found


def test_no_module_outside_the_store_holds_sql_text() -> None:
    held = {}
    for path in _outside_the_store():
        name = str(path.relative_to(ROOT))
        found = sql_text(path.read_text())
        if found:
            held[name] = found
    assert held == {}, (
        "SQL outside django_jobs/store/: make each statement a named one in"
        " django_jobs/store/sql/ and call it through a function of the store"
    )


def test_sql_text_is_told_from_prose_and_docstrings() -> None:
    source = '''
"""SELECT id FROM django_jobs_job, said in a docstring."""
A = "SELECT id FROM django_jobs_job WHERE id = %s"
B = f"LISTEN {CHANNEL}"
C = "update the job, then select what is left from the queue"
E = "LISTEN connection closed"
D = ("UPDATE django_jobs_job"
     " SET state = 'pending'")
cursor.execute(query("claim"))
'''
    assert sql_text(source) == [
        "SELECT id FROM django_jobs_job WHERE id = %s",
        "LISTEN {}",
        "UPDATE django_jobs_job SET state = 'pending'",
        "cursor.execute(",
    ]
