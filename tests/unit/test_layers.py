"""The package's modules import one another one way: commands and admin, then the worker and the
services, then the statements, then the models, then the states, settings and errors.

A module's top-level imports (outside ``if TYPE_CHECKING:``) run when it is imported, and may
only point down or sideways. An import inside a function runs when the function is called; one
that points up is listed in ``LATE_IMPORTS_UP``, so that a new one is a decision, not an
accident. No import of either kind may close a circle: a module that, through any chain of
imports, early or late, imports itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_jobs"

#: Lowest first. A module may import modules of its own layer and of those below. A module
#: belongs to the layer of the longest of these dotted names that it starts with ("" is the
#: package's own ``__init__``).
LAYERS: list[set[str]] = [
    # states, settings, errors, and the pure helpers and shared runtime pieces
    {
        "states",
        "conf",
        "exceptions",
        "storable",
        "sanitize",
        "log_tail",
        "compat",
        "logs",
        "cursor",
        "progress",
        "apiclient",
        "runtime",
        "schedules.cron",
        "rates",
    },
    # the tables, the connection helpers and the SQL they run, the task registry (the workers'
    # allow-list)
    {"models", "store.db", "store.sql", "store.connection", "registry", "tasks"},
    # statements, and the features' logic built on them
    {
        "store",
        "workflows",
        "enqueue",
        "prune",
        "context",
        "steps",
        "schedules.declarations",
        "schedules.ticks",
        "queues",
        "queues.controls",
        "tokens.auth",
        "alerts",
        "rollups",
    },
    # the worker and the services
    {
        "worker",
        "reaper",
        "liveness",
        "operator_actions",
        "backend",
        "checks",
        "apps",
        "schedules.runner",
    },
    # commands, admin, the HTTP API, and the package's public names
    {
        "admin",
        "management",
        "api",
        "",
        "stats",
        "schedules",
        "schedules.admin",
        "schedules.forms",
        "queues.admin",
        "tokens",
        "tokens.admin",
        "metrics",
    },
]

#: Imports inside functions that point up a layer, each with its reason. None of them closes a
#: circle (``test_no_import_closes_a_circle_early_or_late``).
LATE_IMPORTS_UP = {
    # Job.cancel(), retry() and run_now(), the operators' actions on one job, call the store and
    # the cancellation cascade; neither imports the models.
    ("models.job", "store"),
    ("models.job", "workflows"),
    # Schedule.pause(), resume(), run_now() and recompute_next_run(), for the admin and users,
    # call the ticks by the schedule's id; the ticks never import the schedule's model.
    ("models.schedule", "schedules.ticks"),
    # Task.enqueue() and enqueue_many(), the public way to enqueue: ``django_jobs`` imports
    # the tasks while Django loads its apps, before the models can be imported.
    ("tasks", "enqueue"),
}


def _modules() -> dict[str, Path]:
    """The package's modules by dotted name (``django_jobs.models``), migrations left out."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "migrations" not in parts:
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that an import statement in the module at ``path`` imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules
    base = node.module or ""
    if node.level:  # relative: from the importer's package, up level - 1
        package = path.relative_to(ROOT).parent.parts
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([base] if base else [])])
    submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
    return submodules or ({base} & modules)


def _top_level(body: list[ast.stmt], type_checking: bool = False) -> set[int]:
    """The ids of the import statements that run when the module is imported; or, with
    ``type_checking``, of those under ``if TYPE_CHECKING:``, which never run."""
    found = set()
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if not type_checking:
                found.add(id(node))
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            if type_checking:
                found |= {
                    id(n) for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)
                }
        elif isinstance(node, ast.If | ast.Try):
            handlers = [handler.body for handler in getattr(node, "handlers", [])]
            for block in [node.body, node.orelse, *handlers, getattr(node, "finalbody", [])]:
                found |= _top_level(block, type_checking)
    return found


def imports(early: bool) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: when it is imported (``early``), or later,
    inside its functions. (Those under ``TYPE_CHECKING``, for annotations only, are neither.)"""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        top, annotations = _top_level(tree.body), _top_level(tree.body, type_checking=True)
        graph[name] = {
            imported
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            and id(node) not in annotations
            and (id(node) in top) == early
            for imported in _imported(node, path, set(modules))
        } - {name}
    return graph


def layer(module: str) -> int:
    """The layer of a module: that of the longest name in ``LAYERS`` that it starts with."""
    name = module.removeprefix("django_jobs").removeprefix(".")
    parts = name.split(".") if name else []
    for length in range(len(parts), -1, -1):
        prefix = ".".join(parts[:length])
        for index, members in enumerate(LAYERS):
            if prefix in members and (prefix or not parts):
                return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_two_modules_import_each_other_when_imported() -> None:
    assert cycles(imports(early=True)) == []


def test_no_import_closes_a_circle_early_or_late() -> None:
    early, late = imports(early=True), imports(early=False)
    every = {module: early.get(module, set()) | late.get(module, set()) for module in early}
    assert cycles(every) == [], (
        "these modules import each other through a chain that includes an import inside a "
        "function; move the shared piece down a layer, or pass what is needed in as an argument"
    )


def test_the_circle_check_sees_a_circle_closed_by_a_late_import() -> None:
    early = {"a": {"b"}, "b": set()}
    late = {"a": set(), "b": {"a"}}  # b imports a inside a function
    every = {module: early[module] | late[module] for module in early}
    assert cycles(early) == []
    assert cycles(every) == [["a", "b"]]


def test_modules_import_only_their_own_layer_and_those_below_when_imported() -> None:
    up = [
        f"{module} imports {other}"
        for module, deps in imports(early=True).items()
        for other in sorted(deps)
        if layer(other) > layer(module)
    ]
    assert up == []


def test_the_imports_that_point_up_are_made_late_and_are_the_known_ones() -> None:
    up = {
        (module, other)
        for module, deps in imports(early=False).items()
        for other in deps
        if layer(other) > layer(module)
    }
    assert up == {(f"django_jobs.{a}", f"django_jobs.{b}") for a, b in LATE_IMPORTS_UP}


def test_the_finder_reads_each_form_of_import() -> None:
    early = imports(early=True)
    assert early["django_jobs.models.job"] == {"django_jobs.progress", "django_jobs.states"}
    assert early["django_jobs.models"] == {
        "django_jobs.models.job",
        "django_jobs.models.attempt",
        "django_jobs.models.dependency",
        "django_jobs.models.live_worker",
        "django_jobs.states",
        "django_jobs.models.schedule",
        "django_jobs.models.queue_control",
        "django_jobs.models.api_token",
        "django_jobs.models.step",
        "django_jobs.models.alert_threshold",
        "django_jobs.models.rollup",
    }
    assert early["django_jobs.workflows"] == {
        "django_jobs.cursor",
        "django_jobs.store.db",
        "django_jobs.store.sql",
        "django_jobs.states",
        "django_jobs.store",
    }
    assert {"django_jobs.tasks", "django_jobs.exceptions"} <= early["django_jobs"]
    assert early["django_jobs.management.commands.jobstats"] == {
        "django_jobs.conf",
        "django_jobs.management.arguments",
        "django_jobs.management.errors",
        "django_jobs.store.operations_views",
    }
    assert "django_jobs.models" not in early["django_jobs.registry"]  # under TYPE_CHECKING
    assert "django_jobs.store" in imports(early=False)["django_jobs.models.job"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
