"""The state machine, checked without a database: the declaration in django_jobs/states.py, and
every statement in the package that writes ``Job.state`` against it.

A statement that writes ``state`` is found in the source (``SET state =``, a ``SET`` list built
from a fragment, an ``INSERT`` or ``COPY`` into the job table, an ORM write of ``state``): in the
named statements of django_jobs/store/sql/*.sql, each of which must say its transition in a
``-- transition:`` line, and in the Python modules, where it must be a module-level constant
declared with its transition (``_X = ENQUEUE.statement(...)``). Each must pick its rows with
the transition's guard, spelled as the transition renders it, and write only the transition's
states. tests/integration/test_state_machine.py runs each declared statement against jobs in
every state.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

from django_jobs import states
from django_jobs.states import (
    ACTIVE_STATES,
    CANCEL,
    CLAIM,
    FAILED_OUTCOMES,
    NEXT_STATES,
    QUEUED_STATES,
    RETRY,
    RUN_NOW,
    TERMINAL_STATES,
    TRANSITIONS,
    UNSUCCESSFUL_OUTCOMES,
    UNSUCCESSFUL_STATES,
    Outcome,
    State,
    can_transition,
)
from django_jobs.store import claim_branch, sql
from django_jobs.store.sql import functions
from tests.unit.helpers import declared_statements_by_name, package_modules

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_jobs"

WAITING, PENDING, RUNNING = State.WAITING, State.PENDING, State.RUNNING
DONE, ERROR, CANCELLED = State.DONE, State.ERROR, State.CANCELLED


# ---------------------------------------------------------------------- the declaration


def test_the_state_graph_is_the_documented_one() -> None:
    assert dict(NEXT_STATES) == {
        WAITING: {PENDING, CANCELLED, DONE, ERROR},
        PENDING: {RUNNING, CANCELLED},
        RUNNING: {DONE, ERROR, CANCELLED, PENDING, WAITING},
        DONE: set(),
        ERROR: {PENDING},
        CANCELLED: {PENDING},
    }
    assert can_transition(RUNNING, WAITING) and can_transition(WAITING, DONE)
    assert not can_transition(PENDING, WAITING) and not can_transition(DONE, PENDING)


def test_a_job_leaves_a_finished_state_only_through_an_operators_retry() -> None:
    leaving = {t for t in TRANSITIONS if t.sources & TERMINAL_STATES}
    assert leaving == {RETRY}
    assert RETRY.sources == UNSUCCESSFUL_STATES


def test_every_state_is_active_or_finished_and_a_new_job_can_reach_each() -> None:
    assert set(State.values) == ACTIVE_STATES | TERMINAL_STATES
    assert not ACTIVE_STATES & TERMINAL_STATES
    assert ACTIVE_STATES - {RUNNING} == QUEUED_STATES
    assert TERMINAL_STATES - {DONE} == UNSUCCESSFUL_STATES
    assert CANCEL.sources == ACTIVE_STATES
    reachable, todo = set(), [s for _, s in states.ENQUEUE.moves]
    while todo:
        state = todo.pop()
        if state not in reachable:
            reachable.add(state)
            todo += NEXT_STATES[state]
    assert reachable == set(State.values)


def test_moves_pair_each_source_with_each_target_and_keep_the_unchanged() -> None:
    assert CLAIM.moves == {(PENDING, RUNNING)}
    assert states.ENQUEUE.moves == {(None, PENDING), (None, WAITING), (None, CANCELLED)}
    assert CANCEL.moves == {(WAITING, CANCELLED), (PENDING, CANCELLED), (RUNNING, RUNNING)}
    assert RUN_NOW.moves == {(PENDING, PENDING)}


def test_guards_render_the_source_states_in_declaration_order() -> None:
    assert CLAIM.guard() == "state = 'pending'"
    assert RETRY.guard("j") == "j.state IN ('error', 'cancelled')"
    assert CANCEL.guard("c") == "c.state IN ('waiting', 'pending', 'running')"
    assert states.sql_in(TERMINAL_STATES) == "('done', 'error', 'cancelled')"


def test_failed_outcomes_are_the_ones_migration_0003_counts() -> None:
    # The operations views and attempt_failed_idx were made from a literal list.
    migration = importlib.import_module("django_jobs.migrations.0003_operations")
    assert set(re.findall(r"'(\w+)'", migration.FAILED)) == FAILED_OUTCOMES
    assert FAILED_OUTCOMES | {Outcome.CANCELLED} == UNSUCCESSFUL_OUTCOMES


def test_the_tasks_backend_reads_every_state_and_names_every_unsuccessful_attempt() -> None:
    from django_jobs import backend

    assert set(backend.STATUS) == set(State.values)
    assert set(backend._INTERRUPTIONS) == UNSUCCESSFUL_OUTCOMES - {Outcome.ERROR}


# ---------------------------------------------------------------------- finding the writers

_STATE_WRITE = re.compile(
    r"""
      \bSET\s+state\s*=                                   # SET state = ...
    | \bUPDATE\b[^;]*?\bSET\s*\{                          # SET {a fragment}, which may set it
    | \bUPDATE\b[^;]*?\bSET\b[^;]*?,\s*state\s*=(?!=)     # ..., state = ... in a SET list
    | \b(?:INSERT\s+INTO|COPY)\s+(?:django_jobs_job|\{[\w.]*JOB\})(?!\w)   # new jobs
    """,
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)
_ORM_WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_create"}


@dataclasses.dataclass(frozen=True)
class Writer:
    """A place in the source that writes ``Job.state``."""

    line: int
    #: The module-level name the statement is assigned to; None inside a function or class.
    owner: str | None
    what: str


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with each interpolation as ``{expression}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
            for part in node.values
        )
    return None


def state_writers(source: str) -> list[Writer]:
    """Every place in a module's ``source`` that writes ``Job.state``."""
    found = []
    for top in ast.parse(source).body:
        owner = None
        if isinstance(top, ast.Assign) and len(top.targets) == 1:
            target = top.targets[0]
            owner = target.id if isinstance(target, ast.Name) else None
        elif isinstance(top, ast.AnnAssign) and isinstance(top.target, ast.Name):
            owner = top.target.id
        nodes = list(ast.walk(top))
        docstrings = {id(n.value) for n in nodes if isinstance(n, ast.Expr) and _text(n.value)}
        parts = {id(p) for n in nodes if isinstance(n, ast.JoinedStr) for p in n.values}
        for node in nodes:
            if id(node) in docstrings or id(node) in parts:
                continue
            text = _text(node)
            if text is not None and _STATE_WRITE.search(text):
                what = " ".join(text.split())[:80]
                found.append(Writer(node.lineno, owner, what))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in _ORM_WRITES and any(k.arg == "state" for k in node.keywords):
                    found.append(Writer(node.lineno, None, f"ORM .{node.func.attr}(state=...)"))
            elif isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == "state" for t in targets):
                    found.append(Writer(node.lineno, None, "assigns .state"))
    return sorted(found, key=lambda writer: writer.line)


def writers_in_package() -> dict[str, list[Writer]]:
    """Module name -> the places in it that write ``Job.state``."""
    found = {}
    for name, path in package_modules().items():
        if writers := state_writers(path.read_text()):
            found[name] = writers
    return found


def sql_writers() -> dict[str, Writer]:
    """Query name -> the named statement of django_jobs/store/sql/ that writes ``Job.state``."""
    return {
        name: Writer(0, name, " ".join(found.text.split())[:80])
        for name, found in sql.QUERIES.items()
        if _STATE_WRITE.search(found.text)
    }


# ---------------------------------------------------------------------- the writers


def test_every_statement_that_writes_state_is_declared_with_its_transition() -> None:
    undeclared = []
    for module_name, writers in writers_in_package().items():
        module = importlib.import_module(module_name)
        for writer in writers:
            text = getattr(module, writer.owner, None) if writer.owner else None
            if not isinstance(text, str) or text not in states.declared_statements():
                where = writer.owner or "(not a module-level statement)"
                undeclared.append(f"{module_name}:{writer.line} {where}: {writer.what}")
    for name, writer in sql_writers().items():
        if sql.QUERIES[name].transition is None:
            undeclared.append(f"{sql.QUERIES[name].file}: {name}: {writer.what}")
    assert not undeclared, (
        "these write Job.state without a declared transition; give each named statement of "
        "django_jobs/store/sql/ a '-- transition: <name>' line, and make each in Python a "
        "module-level statement declared with its transition "
        "(NAME = <transition>.statement(...)) in django_jobs/states.py:\n" + "\n".join(undeclared)
    )


def test_the_newest_version_of_each_database_function_is_read_as_a_statement() -> None:
    # The functions' writes are checked where they live: in django_jobs/store/sql/functions/.
    for newest in functions.newest():
        found = sql.QUERIES[newest.name]
        assert found.file == f"functions/{newest.file}"
        assert " ".join(found.text.split()) == " ".join(newest.statement.split())
    assert {name for name in sql_writers() if name.startswith("django_jobs_")} == {
        "django_jobs_claim",
        "django_jobs_finish",
    }


def test_every_transition_is_made_by_a_declared_statement() -> None:
    made = {transition for _, transition in declared_statements_by_name().values()}
    assert made == set(TRANSITIONS)


_STATES = "|".join(State.values)
_WRITTEN = re.compile(
    rf"(?:\bSET\s+state\s*=|,\s*state\s*=|^\s*state\s*=|\bTHEN|\bELSE)\s*'({_STATES})'",
    re.IGNORECASE | re.MULTILINE,
)


# A call of a database function (not the line that makes one).
_CALL = re.compile(r"(?<!FUNCTION )\b(django_jobs_\w+)\s*\(")


def written_states(sql_text: str) -> set[str]:
    """The state literals a statement may write: assigned to ``state``, or the result of a
    ``CASE`` (which, in these statements, is what a ``SET state =`` takes); and those of the
    package's database functions it calls (the reap ends an attempt by calling the finish)."""
    written = set(_WRITTEN.findall(sql_text))
    for called in set(_CALL.findall(sql_text)) & {found.name for found in functions.newest()}:
        written |= written_states(sql.query(called))
    return written


def test_each_declared_statement_guards_on_its_sources_and_writes_only_its_targets() -> None:
    wrong = []
    for name, (text, transition) in declared_statements_by_name().items():
        written = written_states(text)
        if not written <= transition.targets | transition.unchanged:
            extra = sorted(written - transition.targets - transition.unchanged)
            wrong.append(f"{name} writes {extra}, not declared for {transition.name!r}")
        body = re.escape(transition.guard()[len("state") :])
        if transition.sources and not re.search(rf"(?<![\w.])(\w+\.)?state{body}", text):
            wrong.append(f"{name} does not guard on {transition.guard()!r}")
    assert not wrong, "\n".join(wrong)


# A condition on a job row's state, in a WHERE or after an AND: the row's alias, and the condition.
_STATE_CONDITION = re.compile(
    r"\b(?:WHERE|AND)\s+((?:(\w+)\.)?state\s*(?:=\s*'\w+'|<>\s*'\w+'|(?:NOT\s+)?IN\s*\([^)]*\)))",
    re.IGNORECASE,
)
# The job rows a statement writes: the alias of each UPDATE of the job table ("" for none).
_UPDATED_ALIAS = re.compile(
    r"\bUPDATE\s+django_jobs_job(?:\s+(?!SET\b)(\w+))?\s+SET\b", re.IGNORECASE
)


def guards(sql_text: str) -> list[tuple[str, str]]:
    """The conditions on the state of the rows a statement updates, with each one's alias: those
    on the UPDATE's alias, and those that name no alias."""
    written = {alias or "" for alias in _UPDATED_ALIAS.findall(sql_text)} | {""}
    return [
        (alias, condition)
        for condition, alias in _STATE_CONDITION.findall(sql_text)
        if alias in written
    ]


def test_every_guard_is_spelled_as_its_transition_renders_it() -> None:
    # The SQL is final text: what keeps it and the declaration from drifting apart is that each
    # condition on the written rows' state is exactly the transition's guard.
    wrong = []
    for name, (text, transition) in declared_statements_by_name().items():
        if not transition.sources:
            continue
        for alias, condition in guards(text):
            if " ".join(condition.split()) != transition.guard(alias):
                wrong.append(f"{name}: {condition!r}, not {transition.guard(alias)!r}")
    assert not wrong, "\n".join(wrong)


def test_the_guard_finder_reads_the_conditions_on_the_written_rows() -> None:
    text = """
    UPDATE django_jobs_job j SET state = 'pending'
    WHERE j.id = 1 AND j.state IN ('error', 'done') AND NOT EXISTS (
        SELECT 1 FROM django_jobs_job o WHERE o.state = 'running' AND state <> 'done')
    RETURNING CASE WHEN j.state = 'pending' THEN 1 END
    """
    assert guards(text) == [("j", "j.state IN ('error', 'done')"), ("", "state <> 'done'")]
    assert guards("UPDATE django_jobs_job SET x = 1 WHERE state = 'pending'") == [
        ("", "state = 'pending'")
    ]


def test_the_statements_found_are_the_ones_expected() -> None:
    # A reading aid as much as a check: every statement that writes state, with its transition.
    found = {name: t.name for name, (_, t) in declared_statements_by_name().items()}
    assert found == {
        "insert_plain_job": "enqueue",
        "insert_job": "enqueue",
        "copy_jobs": "enqueue",
        # The worker's functions (the newest of functions/*.sql).
        "django_jobs_claim": "claim",
        "django_jobs_finish": "end attempt",
        "reap": "end attempt",
        "release": "release",
        "hand_back": "release",
        "cancel_many": "cancel",
        "expire_due": "expire",
        "retry_many": "retry",
        "promote": "promote",
        "cancel_dependents": "cancel dependents",
        "cancel_children": "cancel",
        "finalize_parent": "finalize parent",
        "settle_new": "settle new dependent",
        # Writes run_after only; declared for its guard.
        "run_now_many": "run now",
    }


def test_a_new_statement_that_writes_state_is_found() -> None:
    # The finder itself: each way of writing state that the package could grow.
    source = '''
JOB = "django_jobs_job"
READS = f"SELECT id FROM {JOB} WHERE state = 'pending' AND id = %s"
BURY = f"""UPDATE {JOB} SET state = 'buried' WHERE id = %s"""
LATER = f"""UPDATE {JOB} j SET run_after = now(), state = 'pending' WHERE j.id = %s"""
FRAGMENT = f"""UPDATE {JOB} j SET {SOMETHING} WHERE j.id = %s"""
BORN = "INSERT INTO django_jobs_job (task) VALUES (%s)"
MANY = "copy django_jobs_job (task) FROM STDIN"


def inline(cursor):
    """Docstrings are no statements: SET state = 'x'."""
    cursor.execute("UPDATE django_jobs_job SET state = 'done'")


def orm(job):
    Job.objects.filter(pk=job.pk).update(state="done")
    job.state = "done"
'''
    found = [(w.line, w.owner) for w in state_writers(source)]
    assert found == [
        (4, "BURY"),
        (5, "LATER"),
        (6, "FRAGMENT"),
        (7, "BORN"),
        (8, "MANY"),
        (13, None),
        (17, None),
        (18, None),
    ]


def test_the_states_a_statement_writes_are_read_from_its_assignments_and_cases() -> None:
    assert written_states(claim_branch("claim_any_queue")) == {RUNNING}
    assert written_states(sql.query("reap")) == {DONE, WAITING, CANCELLED, PENDING, ERROR}
    assert written_states(sql.query("django_jobs_finish")) == written_states(sql.query("reap"))
    assert written_states(sql.query("cancel_many")) == {RUNNING, CANCELLED}
    assert written_states(sql.query("finalize_parent")) == {DONE, ERROR, CANCELLED}
    assert written_states(sql.query("run_now_many")) == set()


def test_a_named_statement_that_writes_state_is_found() -> None:
    source = """
-- name: reads
SELECT id FROM django_jobs_job WHERE state = 'pending'

-- name: bury
-- transition: cancel
-- Describes it.
UPDATE django_jobs_job SET state = 'cancelled' WHERE state = 'pending'
"""
    reads, bury = sql.parse(source, "test.sql")
    assert (reads.name, reads.transition, bury.name, bury.transition) == (
        "reads",
        None,
        "bury",
        CANCEL,
    )
    assert bury.text.startswith("UPDATE") and bury.description == "Describes it."
    assert not _STATE_WRITE.search(reads.text) and _STATE_WRITE.search(bury.text)
