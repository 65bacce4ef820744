"""DESIGN.md's rooms, read from the source: what each room may import, no import circles, no branch
on a task kind's name outside tasks/, and outside tasks/ no task attribute that ``Task`` does not
declare and no switch on a task attribute's value. (What importing a room loads, in a fresh interpreter:
tests/integration/test_import_weight.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

# -- DESIGN.md's rooms, read from the source (every import, also those inside functions) ---------
ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("core", "tasks", "validation", "training", "evaluation", "registry", "flows")
MAY_IMPORT = {
    "core": {"core"},
    "tasks": {"core", "tasks"},  # never training: the engine asks the task, not the other way
    "validation": {"core", "tasks", "validation"},
    "training": {"core", "tasks", "training"},
    "evaluation": {"core", "tasks", "evaluation"},
    "registry": {"core", "tasks", "registry"},
    "flows": set(ROOMS),
}
# The built-in tasks' names: a room outside tasks/ that compares with one branches on the kind.
KIND_NAMES = {"classification", "regression", "lm"}


def _modules() -> dict[str, Path]:
    out = {}
    for room in ROOMS:
        for f in sorted((ROOT / room).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import in ``path``; ``from a import b`` gives ``a.b``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def room_violations(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    bad = []
    for name, path in modules.items():
        room = name.split(".")[0]
        for line, imported in _imports(path):
            top = imported.split(".")[0]
            if top in ROOMS and top not in MAY_IMPORT[room]:
                bad.append(f"{path.relative_to(root)}:{line} imports {imported} ({room}/ may import "
                           f"{', '.join(sorted(MAY_IMPORT[room]))})")
    return bad


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """The strongly connected parts (more than one module) of the graph of our imports."""
    def owner(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph = {m: {o for _, i in _imports(p) if (o := owner(i)) and o != m} for m, p in modules.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
                on.discard(part[-1])
            if len(part) > 1:
                circles.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def kind_branches(path: Path, root: Path = ROOT) -> list[str]:
    """Where ``path`` compares with a built-in task's name, or tests a task's attributes by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = ([side] if isinstance(side, ast.Constant) else
                          list(side.elts) if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [])
                if any(isinstance(v, ast.Constant) and v.value in KIND_NAMES for v in values):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
              and node.args and "task" in ast.unparse(node.args[0])):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and node.attr == "classification":
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def task_api(base: Path = ROOT / "tasks" / "base.py") -> set[str]:
    """What ``Task`` declares: its methods and class attributes (read from ``tasks/base.py``)."""
    tree = ast.parse(base.read_text())
    task = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Task")
    return ({n.name for n in task.body if isinstance(n, ast.FunctionDef)}
            | {n.target.id for n in task.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            | {t.id for n in task.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)})


def task_uses(source: str, where: str, api: set[str]) -> list[str]:
    """Where ``source`` (a module outside tasks/) reads a task attribute ``Task`` does not declare (a flag,
    or a method of one kind of task), or compares a task attribute with a string (a switch on its value).
    A task is ``task``, ``task_``, ``x.task``, ``get_task(...)``, or a name assigned from one of those."""
    tree = ast.parse(source, where)

    def is_task(node: ast.AST, names: set[str]) -> bool:
        if isinstance(node, ast.Call):  # get_task(k) and a task's own copies, task.with_primary(m)
            f = node.func
            return ((isinstance(f, ast.Name) and f.id == "get_task")
                    or (isinstance(f, ast.Attribute) and f.attr.startswith("with_") and is_task(f.value, names)))
        return ((isinstance(node, ast.Name) and node.id in names)
                or (isinstance(node, ast.Attribute) and node.attr == "task"))

    names = {"task", "task_"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and is_task(node.value, names):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_task(node.value, names) and node.attr not in api:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (Task declares no {node.attr})")
        elif isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            if (any(isinstance(v, ast.Attribute) and is_task(v.value, names) for v in sides)
                    and any(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in sides)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (a switch on a task attribute)")
    return found


def test_each_room_imports_only_what_design_md_allows():
    assert room_violations(_modules()) == []


def test_no_import_circles():
    assert import_circles(_modules()) == []


def test_no_branch_on_a_kinds_name_outside_tasks():
    assert [b for n, p in _modules().items() if not n.startswith("tasks") for b in kind_branches(p)] == []


def test_rooms_call_only_what_task_declares():
    api = task_api()
    assert [u for n, p in _modules().items() if not n.startswith("tasks")
            for u in task_uses(p.read_text(), str(p.relative_to(ROOT)), api)] == []


def test_the_task_check_catches_flags_switches_and_undeclared_methods():
    """Each rule of ``task_uses`` fails a planted violation; declared methods pass."""
    api = task_api()
    planted = ("def f(task, ctx):\n"
               "    ok = task.metrics, ctx.task.loss(1, 2), get_task('x').evaluator()\n"  # declared: fine
               "    if task.has_x:\n"  # a flag Task does not declare
               "        return task.evaluator == 'documents'\n"  # a switch on a task attribute
               "    chosen = get_task(ctx.kind)\n"
               "    chosen.targets(1)\n"  # a method of one kind of task, through a name bound to a task
               "    return ctx.task.with_primary(None).features_of(2)\n")
    assert [u.split(": ", 1)[1] for u in task_uses(planted, "p.py", api)] == [
        "task.has_x (Task declares no has_x)",
        "task.evaluator == 'documents' (a switch on a task attribute)",
        "chosen.targets (Task declares no targets)",
        "ctx.task.with_primary(None).features_of (Task declares no features_of)"]


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Each check finds a violation of its own kind, written into a scratch copy of the rooms."""
    fake = {"tasks.x": tmp_path / "x.py", "training.y": tmp_path / "y.py", "training.z": tmp_path / "z.py"}
    fake["tasks.x"].write_text("def f():\n    from training.y import g\n")
    fake["training.y"].write_text("from training.z import h\n")
    fake["training.z"].write_text("def h():\n    import training.y\n    return task.name == 'lm'\n")
    assert [v.split(" (")[0] for v in room_violations(fake, tmp_path)] == ["x.py:2 imports training.y.g"]
    assert import_circles(fake) == [["training.y", "training.z"]]
    assert kind_branches(fake["training.z"], tmp_path) == ["z.py:3: task.name == 'lm'"]
