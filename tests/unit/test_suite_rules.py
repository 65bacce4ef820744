"""The suite's own rules (docs/testing.md), read from the source of every file under tests/: each
test asserts something, no test sleeps outside ALLOWED_SLEEPS, none asserts on a duration; and
tests/unit's guard refuses every way of starting a process. Each check is shown to find a planted
violation, so that an empty list means something."""

from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.unit.conftest import SubprocessInUnitTest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

# Where a sleep IS the behaviour, or is the poll of the one wait helper: (file, function) -> why.
ALLOWED_SLEEPS = {
    ("tests/waiting.py", "wait_for"): "the poll interval of the wait-on-an-event helper",
    ("tests/slurm_cluster.py", "poll"): "the poll interval of the test cluster's own wait on its daemons and jobs "
                                        "(the module also runs standalone, outside the tests package)",
    ("tests/fault/stubborn_worker.py", "main"): "a worker that ignores SIGTERM and must stay alive until killed",
    ("tests/integration/probes/metrics_probe.py", "train"): "a rank made slow on purpose (the straggler under test)",
    ("tests/integration/test_promotion_prefect.py", "promoter"):
        "a promoter that holds the concurrency limit while the other must wait (the wait under test)",
    ("tests/integration/test_concurrency.py", "deserves"):
        "a promoter slow to decide while it holds the lock, so that the other one contends (the race under test)",
}
CLOCKS = {"monotonic", "perf_counter", "time", "process_time", "monotonic_ns", "perf_counter_ns", "time_ns"}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _sources(folder: Path = TESTS) -> dict[str, str]:
    return {str(p.relative_to(folder.parent)): p.read_text() for p in sorted(folder.rglob("*.py"))}


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


@functools.lru_cache(maxsize=None)
def _parse(src: str) -> ast.Module:
    return ast.parse(src)


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@functools.lru_cache(maxsize=None)
def _facts(f: ast.AST) -> tuple[bool, frozenset[str]]:
    """(whether ``f`` asserts by itself: an assert, a ``raise AssertionError``, pytest.raises / warns /
    fail, or an ``assert_*`` call such as numpy's; the names it calls)."""
    direct, calls = False, set()
    for n in ast.walk(f):
        if isinstance(n, ast.Assert):
            direct = True
        elif isinstance(n, ast.Raise) and n.exc is not None and "AssertionError" in ast.unparse(n.exc):
            direct = True
        elif isinstance(n, ast.Call) and (name := _called_name(n)):
            calls.add(name)
            if name.startswith("assert_") or (
                    name in ("raises", "warns", "fail", "deprecated_call") and "pytest" in ast.unparse(n.func)):
                direct = True
    return direct, frozenset(calls)


def _asserts(f: ast.AST, helpers: set[str]) -> bool:
    direct, calls = _facts(f)
    return direct or bool(calls & helpers)


def asserting_helpers(sources: dict[str, str]) -> set[str]:
    """Names of the functions under tests/ that assert (directly or through another such function)."""
    funcs = [f for src in sources.values() for f in _functions(_parse(src)) if not f.name.startswith("test")]
    helpers: set[str] = set()
    while True:
        more = {f.name for f in funcs if f.name not in helpers and _asserts(f, helpers)}
        if not more:
            return helpers
        helpers |= more


def unasserted_tests(sources: dict[str, str]) -> list[str]:
    helpers = asserting_helpers(sources)
    return [f"{path}:{f.lineno} {f.name}" for path, src in sources.items()
            for f in _functions(_parse(src)) if f.name.startswith("test") and not _asserts(f, helpers)]


def _enclosing(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node's innermost enclosing function name ("" at module level)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            owner[child] = inner
            visit(child, inner)

    visit(tree, "")
    return owner


def sleeps(sources: dict[str, str], allowed=ALLOWED_SLEEPS) -> list[str]:
    """Every ``time.sleep`` / ``sleep`` / ``asyncio.sleep`` call outside ``allowed``."""
    found = []
    for path, src in sources.items():
        if "sleep" not in src:
            continue
        tree = _parse(src)
        owner = _enclosing(tree)
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and _called_name(n) == "sleep" and (path, owner[n]) not in allowed:
                found.append(f"{path}:{n.lineno} in {owner[n] or '<module>'}: {ast.unparse(n)}")
    return found


def _is_clock(n: ast.AST) -> bool:
    return (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CLOCKS
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "time")


def duration_asserts(sources: dict[str, str]) -> list[str]:
    """Asserts that order (<, <=, >, >=) a duration: a difference of clock readings (inline, or a name
    given one, such as ``elapsed``) or a deadline (a name given a reading plus a constant). Readings
    alone may be ordered (a recorded timestamp lies between two readings)."""
    found = []
    for path, src in sources.items():
        if not any(f".{clock}(" in src for clock in CLOCKS):
            continue
        for f in _functions(_parse(src)):
            readings: set[str] = set()
            spans: set[str] = set()

            def has(expr: ast.AST, names: set[str], clock: bool = False) -> bool:
                return any((clock and _is_clock(n)) or (isinstance(n, ast.Name) and n.id in names)
                           for n in ast.walk(expr))

            def arithmetic_on_clock(expr: ast.AST) -> bool:
                return any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub))
                           and has(n, readings | spans, clock=True) for n in ast.walk(expr))

            for _ in range(2):  # a name may be given a span computed from a name given earlier
                for n in ast.walk(f):
                    if not isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) or n.value is None:
                        continue
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    names = {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
                    if arithmetic_on_clock(n.value) or has(n.value, spans):
                        spans |= names
                    elif _is_clock(n.value):
                        readings |= names
            for n in ast.walk(f):
                if isinstance(n, ast.Assert):
                    for cmp in (c for c in ast.walk(n.test) if isinstance(c, ast.Compare)):
                        if not any(isinstance(op, ORDERING) for op in cmp.ops):
                            continue
                        inline = any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub)
                                     and has(b, readings | spans, clock=True) for b in ast.walk(cmp))
                        if inline or has(cmp, spans):
                            found.append(f"{path}:{n.lineno} in {f.name}: {ast.unparse(cmp)}")
    return found


# -- the suite holds them ---------------------------------------------------------------------
def test_every_test_asserts_something():
    assert unasserted_tests(_sources()) == []


def test_no_test_sleeps_outside_the_allow_list():
    assert sleeps(_sources()) == []


def test_no_test_asserts_on_a_duration():
    assert duration_asserts(_sources()) == []


def test_each_allowed_sleep_still_exists():
    """An allow-list entry whose sleep is gone would let a new one in unseen."""
    everything = sleeps(_sources(), allowed={})
    for path, function in ALLOWED_SLEEPS:
        assert any(f.startswith(f"{path}:") and f" in {function}: " in f for f in everything), (path, function)


# -- each check finds a planted violation -------------------------------------------------------
PLANTED = {"tests/unit/test_planted.py": textwrap.dedent('''
    import time
    import pytest

    def check(x):
        assert x

    def check_twice(x):
        check(x)
        check(x)

    def test_calls_only(tmp_path):
        tmp_path.mkdir(exist_ok=True)

    def test_asserts():
        assert 1 + 1 == 2

    def test_raises():
        with pytest.raises(ZeroDivisionError):
            1 / 0

    def test_through_a_helper_of_a_helper():
        check_twice(1)

    def test_sleeps_for_an_event():
        time.sleep(1)
        assert True

    def test_times_itself():
        t0 = time.monotonic()
        elapsed = time.monotonic() - t0
        assert elapsed < 5

    def test_times_inline():
        t0 = time.perf_counter()
        assert time.perf_counter() - t0 >= 0.02

    def test_waits_out_a_deadline_in_an_assert(tmp_path):
        deadline = time.monotonic() + 10
        while not (tmp_path / "done").exists():
            assert time.monotonic() < deadline

    def test_orders_readings_only():
        before = time.time()
        recorded = time.time()
        assert before <= recorded <= time.time() and time.monotonic() != 0

    def test_asserts_with_numpy():
        np.testing.assert_array_equal([1], [1])
''')}


def _line(text: str) -> int:
    return next(i for i, line in enumerate(PLANTED["tests/unit/test_planted.py"].splitlines(), 1) if text in line)


def test_the_checks_find_planted_violations_and_only_those():
    where = "tests/unit/test_planted.py"
    assert unasserted_tests(PLANTED) == [f"{where}:{_line('def test_calls_only')} test_calls_only"]
    assert sleeps(PLANTED) == [f"{where}:{_line('time.sleep(1)')} in test_sleeps_for_an_event: time.sleep(1)"]
    assert sleeps(PLANTED, allowed={(where, "test_sleeps_for_an_event"): "why"}) == []
    assert duration_asserts(PLANTED) == [
        f"{where}:{_line('elapsed < 5')} in test_times_itself: elapsed < 5",
        f"{where}:{_line('>= 0.02')} in test_times_inline: time.perf_counter() - t0 >= 0.02",
        f"{where}:{_line('< deadline')} in test_waits_out_a_deadline_in_an_assert: time.monotonic() < deadline",
    ]


# -- the unit guard -----------------------------------------------------------------------------
def test_a_unit_test_cannot_start_a_process():
    """Every way Python starts a process fails here, naming the call. Each child, were one started
    all the same, would exit at once (the checks fail then, and nothing is left behind)."""
    with pytest.raises(SubprocessInUnitTest, match=r"subprocess\.Popen in a unit test"):
        subprocess.run(["true"], check=True)
    with pytest.raises(SubprocessInUnitTest, match="os.system"):
        os.system("true")
    with pytest.raises(SubprocessInUnitTest, match="os.posix_spawn"):
        os.posix_spawn("/bin/true", ["true"], {})
    pid = None
    try:
        with pytest.raises(SubprocessInUnitTest, match="os.fork"):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
    finally:
        if pid:
            os.waitpid(pid, 0)
    for method in ("fork", "spawn"):
        child = multiprocessing.get_context(method).Process(target=os._exit, args=(0,))
        try:
            with pytest.raises(SubprocessInUnitTest):
                child.start()
        finally:
            if child._popen is not None:
                child.join()


def test_wait_for_returns_the_first_answer_and_names_what_it_waited_for():
    from tests.waiting import wait_for

    answers = iter([None, [], ["step_4"]])
    assert wait_for(lambda: next(answers), 60, "a checkpoint", poll_s=0) == ["step_4"]
    with pytest.raises(AssertionError, match=r"gave up after 0 s waiting for the first checkpoint \(last answer: \[\]\)"):
        wait_for(list, 0, "the first checkpoint")
