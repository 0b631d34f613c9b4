"""The package's shape: floors that no import climbs, no import cycle, no hidden local
import, every module importable, no compiler run at run time.

Read from the source with `ast`, so the checks do not depend on the order in which
modules happen to be imported: an import cycle that works in one order and fails in
another is still found.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jaxmnist"
# A function-local import of the package's own modules needs a comment saying why.
REASONS = ("optional extra", "start-up")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package's own modules an import statement depends on: `from pkg import sub`
    needs the submodule only (Python loads it even while pkg's __init__ is running),
    `from pkg import name` needs pkg itself."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level == 0 and node.module:
        names = [
            f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
            for a in node.names
        ]
    else:
        names = []
    return sorted({n for n in names if n in MODULES})


def imports(path: Path) -> tuple[set[str], list[tuple[int, list[str]]]]:
    """(modules imported at module level, [(line, modules)] imported inside functions)."""
    tree = ast.parse(path.read_text())
    top, local = set(), []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and imported(child):
                if in_function:
                    local.append((child.lineno, imported(child)))
                else:
                    top.update(imported(child))
            visit(child, inside)

    visit(tree, False)
    return top, local


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


def test_no_import_cycle():
    graph = {name: imports(path)[0] - {name} for name, path in MODULES.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# The package's rooms on floors, from the bottom up. A room is a folder of the package
# (`data` is jaxmnist/data/) or a module at its top (`config` is jaxmnist/config.py);
# `jaxmnist` is the package's own __init__. A module may import its own room and the
# rooms of lower floors: never a room of its own floor or of a floor above. No exception:
# where an import would climb, the code it wants belongs lower down, and moves there.
# (`jaxmnist/__init__` and `cli` load modules above them by name, with importlib: the
# public names on first use, and the commands. Those are not imports, and not read here.)
FLOORS = (
    # Depend on nothing of the package: errors, draws, the host's memory, the compilation
    # cache, statistics, optimizers, timed windows, the HTML page frame.
    ("jaxmnist", "errors", "rng", "hostmem", "compile_cache", "stats", "optim", "timing", "pages"),
    ("mesh", "data"),  # the mesh's syntax; datasets
    ("models",),
    ("runtime", "config"),
    ("training",),  # the loop and the core it drives
    ("runs",),  # the run directory: writer, checkpoints, resume, reader
    ("use", "profiling"),  # a trained run at work; where a step's time goes
    ("report",),  # seeing runs: plots, pages, TensorBoard
    ("bench", "search", "train"),  # throughput; sweeps and searches; one run's recipe
    ("commands",),
    ("cli",),
    ("__main__",),
)


def room(module: str) -> str:
    """The room of a module of the package: `jaxmnist.use.serve.app` -> `use`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def all_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of the package's modules in the file, wherever it
    stands (module level, in a function, under `if TYPE_CHECKING`)."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return sorted((n.lineno, m) for n in nodes for m in imported(n))


def climbs(modules: dict[str, list[tuple[int, str]]], floors) -> list[str]:
    """Every import of `modules` ({module: [(line, imported module)]}) that goes to a room
    on its own floor or higher, as `module:line imports other (room floor i -> room floor j)`."""
    floor = {r: i for i, rooms in enumerate(floors) for r in rooms}
    found = []
    for name, targets in modules.items():
        here = room(name)
        for line, other in targets:
            there = room(other)
            if there != here and floor[there] >= floor[here]:
                found.append(
                    f"{name}:{line} imports {other} ({here} on floor {floor[here]} -> "
                    f"{there} on floor {floor[there]})"
                )
    return found


def test_every_room_stands_on_one_floor():
    declared = [r for rooms in FLOORS for r in rooms]
    assert len(declared) == len(set(declared)), "a room on two floors"
    rooms = {room(name) for name in MODULES}
    assert rooms == set(declared), (
        f"rooms on no floor: {sorted(rooms - set(declared))}; "
        f"floors naming no room: {sorted(set(declared) - rooms)}"
    )


def test_no_import_climbs_to_its_own_floor_or_higher():
    """Every import of a module goes to its own room or down (see `FLOORS`); relative
    imports, which this reading does not resolve, are not used."""
    relative = [
        f"{name}:{node.lineno}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative, f"relative imports: {relative}"
    found = climbs({name: all_imports(path) for name, path in MODULES.items()}, FLOORS)
    assert not found, "imports that climb:\n" + "\n".join(found)


def test_the_floor_check_finds_a_climb():
    floors = (("base",), ("mid", "side"), ("top",))
    modules = {
        "pkg.mid.a": [(3, "pkg.base.x"), (4, "pkg.mid.b")],  # down, and within its room
        "pkg.side": [(5, "pkg.mid.a")],  # across its floor
        "pkg.base.x": [(7, "pkg.top")],  # up
    }
    assert climbs(modules, floors) == [
        "pkg.side:5 imports pkg.mid.a (side on floor 1 -> mid on floor 1)",
        "pkg.base.x:7 imports pkg.top (base on floor 0 -> top on floor 2)",
    ]


def test_local_imports_of_the_package_say_why():
    unexplained = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for lineno, modules in imports(path)[1]:
            said = _comment_block(lines, lineno)
            if not any(reason in said for reason in REASONS):
                unexplained.append(f"{name}:{lineno} imports {', '.join(modules)}")
    assert not unexplained, "function-local imports without a reason:\n" + "\n".join(unexplained)


def _comment_block(lines: list[str], lineno: int) -> str:
    """Line `lineno` (1-based) and the comment and import lines right above it: where the
    reason for a group of local imports is written."""
    start = lineno - 1
    while start > 0 and _quiet(lines[start - 1]):
        start -= 1
    return "\n".join(lines[start:lineno])


def _quiet(line: str) -> bool:
    """A blank, comment or import line: one that may stand between a reason and its import."""
    text = line.strip()
    return not text or text.startswith(("#", "import ", "from "))


@pytest.mark.parametrize("floor", ["jaxmnist.training.hooks", "jaxmnist.runs.rundir"])
def test_the_loop_vocabulary_and_the_run_files_depend_on_nothing_above(floor):
    """The bottom floors of the run layer import nothing from the loop, the run
    directory's readers or the commands above them."""
    above = ("jaxmnist.training.loop", "jaxmnist.train", "jaxmnist.runs", "jaxmnist.cli")
    above += ("jaxmnist.commands",)
    graph = {name: imports(path)[0] for name, path in MODULES.items()}
    seen, todo = set(), [floor]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert not [m for m in seen if m != floor and any(_within(m, a) for a in above)]


def _within(module: str, name: str) -> bool:
    """`module` is the module or package `name`, or inside it."""
    return module == name or module.startswith(name + ".")


def test_every_module_imports_in_a_fresh_interpreter():
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    optional = {"jaxmnist.use.serve.app", "jaxmnist.use.serve.server"}  # the serve extra
    names = [n for n in MODULES if n != "jaxmnist.__main__"]
    names = [n for n in names if n not in optional or _has("starlette")]
    argv = [sys.executable, "-c", code, *names]
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# Calls that start another program, by module: what the package may start is this Python
# interpreter (a child run, the report's drawing process), never a compiler; native code
# is compiled when a package is installed (jaxmnist-onednn, `native/`), not at run time.
STARTS_A_PROGRAM = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput"},
    "os": {"system", "popen", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
}
SOURCES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp")


def programs_started(tree: ast.Module) -> list[str]:
    """The calls in `tree` that start a program other than this interpreter, as
    "line: source": every list literal in the call's first argument must begin with
    `sys.executable`, and there must be one (a command held in a variable could be
    anything)."""
    bound: dict[str, tuple[str, str | None]] = {}  # local name -> (module, function)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in STARTS_A_PROGRAM:
                    bound[a.asname or a.name] = (a.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module in STARTS_A_PROGRAM:
            for a in node.names:
                bound[a.asname or a.name] = (node.module, a.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module, name = bound.get(func.value.id, (None, None))[0], func.attr
        elif isinstance(func, ast.Name) and func.id in bound:
            module, name = bound[func.id]
        else:
            continue
        if module is None or name not in STARTS_A_PROGRAM[module]:
            continue
        lists = [n for n in ast.walk(node.args[0]) if isinstance(n, ast.List)] if node.args else []
        if not lists or not all(lst.elts and _is_interpreter(lst.elts[0]) for lst in lists):
            found.append(f"{node.lineno}: {ast.unparse(node)[:120]}")
    return found


def _is_interpreter(node: ast.expr) -> bool:
    return ast.unparse(node) == "sys.executable"


def test_no_module_compiles_code_at_run_time():
    """No module starts a program other than Python (a compiler, a shell), and the
    package holds no C or C++ source it could compile."""
    started = {
        name: found
        for name, path in MODULES.items()
        if (found := programs_started(ast.parse(path.read_text())))
    }
    assert not started, f"programs other than Python started: {started}"
    sources = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*") if p.suffix in SOURCES)
    assert not sources, f"native source inside the package (it belongs in native/): {sources}"


@pytest.mark.parametrize(
    "code, flagged",
    [
        ("import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'x'])", False),
        ("import subprocess, sys\nsubprocess.Popen(argv or [sys.executable, '-c', ''])", False),
        ("import subprocess\nsubprocess.run([cxx, '-shared', src])", True),
        ("import subprocess\nsubprocess.run(command)", True),
        ("import subprocess as sp, sys\nsp.check_call(['c++', sys.executable])", True),
        ("from subprocess import run\nrun(['g++', 'x.cc'])", True),
        ("import os\nos.system('c++ -shared x.cc')", True),
        ("import os\nos.environ.get('CXX')", False),
    ],
)
def test_the_compiler_check_tells_python_from_other_programs(code, flagged):
    assert bool(programs_started(ast.parse(code))) == flagged


def config_walk(argv: list[str], stop_at: str = "make_train_steps") -> list[str]:
    """The package files a `Config` passes through, in order, while `jaxmnist <argv>` runs
    up to the call of `stop_at`: every function that takes the config as an argument,
    consecutive calls within one file counted once (the config's own methods and
    comprehensions aside)."""
    from jaxmnist import cli
    from jaxmnist.config import Config

    walk: list[str] = []

    class Reached(Exception):
        pass

    def profile(frame, event, arg) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(str(PACKAGE)):
            return
        args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        given = [frame.f_locals.get(a) for a in args]
        if code.co_name.startswith("<") or not any(isinstance(v, Config) for v in given):
            return
        if isinstance(given[0], Config) and args[0] == "self":
            return  # the config asking itself
        where = str(Path(code.co_filename).relative_to(PACKAGE.parent))
        if not walk or walk[-1] != where:
            walk.append(where)
        if code.co_name == stop_at:
            raise Reached

    sys.setprofile(profile)
    try:
        cli.main(argv)
    except Reached:
        pass
    finally:
        sys.setprofile(None)
    return walk


def test_the_config_walks_a_short_way_from_the_train_command_to_the_step(train_argv, tmp_path):
    """At most 8 files and 3 climbs back into a file already left (issue #20's goal):
    the command, the config, the run, the loop, the population, the step, the memory
    estimate; the mesh is built from the config's `parallel` section alone."""
    walk = config_walk(train_argv(tmp_path / "run", "--no-report", "--steps", "2"))
    climbs = len(walk) - len(set(walk))
    assert walk[-1] == "jaxmnist/training/step.py"
    assert len(set(walk)) <= 8 and climbs <= 3, walk
