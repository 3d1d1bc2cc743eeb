"""The import structure stays a house a newcomer can read: no module of
``fairseq_hybrid`` imports another that imports it back (imports inside
functions count), the engine (``parallel/``) never imports the model
(``models/``) nor the loss (``criterions/``), the hand-written kernels
(``kernels/``) import nothing of the package, no product module imports the harness (``harness/``), which
is loaded only when asked for, every other module uses the engine only
through its face, the engine's runtime never imports its recipe, nothing that
trains imports the GPU forecasts
(``forecasts/``), and nothing shipped or scripted imports from
``tests/`` or edits ``sys.path``."""

import ast
import os
import re
import subprocess
import sys

from conftest import REPO

PACKAGE = os.path.join(REPO, "fairseq_hybrid")
TEST_MODULES = {name[:-3] for name in os.listdir(os.path.join(REPO, "tests")) if name.endswith(".py")}


def module_name(path):
    parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules():
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                modules[module_name(path)] = path
    return modules


def imported(path, name, modules):
    """Every module of ``modules`` that ``path`` (module ``name``) imports,
    at module level or inside a function."""
    is_package = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            # "from PKG import name": the submodule PKG.name where there is
            # one (PKG's own __init__ runs too, as for any import, and is
            # not counted), else PKG itself
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                       for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def test_no_import_cycles_and_the_engine_never_imports_the_model():
    modules = package_modules()
    graph = {name: imported(path, name, modules) for name, path in modules.items()}
    # the package's own __init__ imports its parts to register them; a part
    # never imports the top package, so leaving the top out hides nothing
    assert not any("fairseq_hybrid" in targets for targets in graph.values())
    cycles = []

    def visit(name, path):
        for target in sorted(graph[name]):
            if target in path:
                cycles.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(name)

    done = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)
    back = sorted((name, target) for name, targets in graph.items() if name.startswith("fairseq_hybrid.parallel")
                  for target in targets if target.startswith(("fairseq_hybrid.models", "fairseq_hybrid.criterions")))
    assert not back, f"the engine imports the model or the loss: {back}"
    # the hand-written arithmetic sits below everything that calls it
    kernels = sorted((name, target) for name, targets in graph.items() if name.startswith("fairseq_hybrid.kernels")
                     for target in targets if not target.startswith("fairseq_hybrid.kernels"))
    assert not kernels, f"the kernels import the package: {kernels}"


def import_graph():
    modules = package_modules()
    return {name: imported(path, name, modules) for name, path in modules.items()}


def test_no_product_module_imports_the_harness():
    harness = "fairseq_hybrid.harness"
    offenders = sorted((name, target) for name, targets in import_graph().items()
                       if not name.startswith(harness) and name != "fairseq_hybrid"
                       for target in targets if target.startswith(harness))
    assert not offenders, f"product modules import the harness: {offenders}"
    # the package's own __init__ imports it only under its environment variable
    init = open(os.path.join(PACKAGE, "__init__.py")).read()
    tree = ast.parse(init)
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not any("harness" in (node.module or "") for node in top_level if isinstance(node, ast.ImportFrom))


def test_the_harness_is_loaded_only_when_asked_for():
    probe = "import sys, fairseq_hybrid; print(sorted(m for m in sys.modules if m.startswith('fairseq_hybrid.harness')))"
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAIRSEQ_HYBRID_")}
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert plain.stdout.strip() == "[]"
    asked = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True,
                           env={**env, "FAIRSEQ_HYBRID_VIRTUAL_DEVICES": "1"})
    assert "fairseq_hybrid.harness.virtual_devices" in asked.stdout


def test_every_product_module_uses_the_engine_through_its_face():
    """Outside the engine only its face is imported (the harness alone
    hooks into the workers' thread state and streams); the planner and the
    forecasts import neither the group nor the model."""
    offenders = sorted((name, target) for name, targets in import_graph().items()
                       if not name.startswith(("fairseq_hybrid.parallel", "fairseq_hybrid.harness"))
                       for target in targets if target.startswith("fairseq_hybrid.parallel."))
    assert not offenders, f"modules reach into the engine past its face: {offenders}"
    above = sorted((name, target) for name, targets in import_graph().items()
                   if name.startswith(("fairseq_hybrid.planning", "fairseq_hybrid.forecasts"))
                   for target in targets if target in ("fairseq_hybrid.hybrid_group", "fairseq_hybrid.models"))
    assert not above, f"the planner or the forecasts import the group or the model: {above}"
    # what a run decides never needs a GPU forecast; the group never runs one
    forecasts = sorted((name, target) for name, targets in import_graph().items()
                       if name.startswith(("fairseq_hybrid.planning", "fairseq_hybrid.hybrid_group",
                                           "fairseq_hybrid.parallel", "fairseq_hybrid.models"))
                       for target in targets if target.startswith("fairseq_hybrid.forecasts"))
    assert not forecasts, f"training imports the GPU forecasts: {forecasts}"
    engine = sorted((name, target) for name, targets in import_graph().items()
                    if name.startswith("fairseq_hybrid.parallel")
                    for target in targets if target.startswith(("fairseq_hybrid.planning", "fairseq_hybrid.hybrid_group")))
    assert not engine, f"the engine imports the planner or the group: {engine}"


# The engine laid out as torchgpipe's, one room a folder: the runtime runs
# any cells on any group (runtime/: threads, and what both kinds of worker
# share), a process per device with its wires (processes/), and the recipe of
# a hybrid step (recipe/: how a step is cut into cells, which a worker is
# handed); the face (__init__.py) and step.py, which ties a recipe to a
# runtime, alone stand beside them.
ROOMS = {"runtime": (), "processes": ("runtime",), "recipe": ("runtime",)}  # room -> the rooms it may import
BESIDE = {"fairseq_hybrid.parallel", "fairseq_hybrid.parallel.step"}


def test_every_engine_module_is_in_a_room_and_no_room_imports_past_its_own():
    graph = import_graph()
    engine = {name for name in graph if name.startswith("fairseq_hybrid.parallel")}

    def room(name):
        parts = name.split(".")
        return parts[2] if len(parts) > 2 and parts[2] in ROOMS else None

    unplaced = sorted(name for name in engine if room(name) is None and name not in BESIDE)
    assert not unplaced, f"every module of parallel/ in a room ({', '.join(ROOMS)}): unplaced {unplaced}"
    assert BESIDE <= engine, f"gone from parallel/: {sorted(BESIDE - engine)}"
    offenders = sorted((name, target) for name in engine if room(name) for target in graph[name]
                       if target.startswith("fairseq_hybrid.parallel") and room(target) != room(name)
                       and room(target) not in ROOMS[room(name)])
    assert not offenders, f"a room of the engine imports past its own: {offenders}"


def test_no_two_rooms_import_each_other():
    """A folder of the package is one room: no two rooms import each other
    (a module of timing/ reading a forecast while a module of forecasts/
    times a step would put each above the other)."""
    def room(name):
        parts = name.split(".")
        folder = os.path.join(PACKAGE, *parts[1:2])
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and os.path.isdir(folder)) else name

    rooms = {}
    for name, targets in import_graph().items():
        for target in targets:
            if room(name) != room(target):
                rooms.setdefault(room(name), set()).add(room(target))
    both_ways = sorted((a, b) for a, targets in rooms.items() for b in targets if a < b and a in rooms.get(b, ()))
    assert not both_ways, f"rooms that import each other: {both_ways}"


def test_the_checker_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "a.py"
    source.write_text("def f():\n    from .b import thing\n    from . import c\n")
    assert imported(str(source), "pkg.a", {"pkg", "pkg.a", "pkg.b", "pkg.c"}) == {"pkg.b", "pkg.c"}
    source.write_text("from . import helper\n")
    assert imported(str(source), "pkg.a", {"pkg", "pkg.a"}) == {"pkg"}  # a name defined in pkg/__init__


def test_nothing_outside_tests_imports_from_tests():
    offenders = []
    for folder in ("fairseq_hybrid", "scripts", "benchmarks", "recipes"):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                text = open(path).read()
                for node in ast.walk(ast.parse(text)):
                    names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    if any(n.split(".")[0] in TEST_MODULES | {"tests"} for n in names):
                        offenders.append(os.path.relpath(path, REPO))
                if re.search(r"sys\.path\.(insert|append)\([^\n]*tests", text):
                    offenders.append(os.path.relpath(path, REPO) + " (puts tests/ on sys.path)")
    assert not offenders, offenders


def test_scripts_import_the_installed_package_not_each_other():
    """An entry script under scripts/ or benchmarks/ imports no other entry
    script (what they share is the package's, ``fairseq_hybrid.harness.measuring``)
    and never edits ``sys.path``."""
    offenders = []
    for folder in ("scripts", "benchmarks"):
        path = os.path.join(REPO, folder)
        scripts = {name[:-3] for name in os.listdir(path) if name.endswith(".py")}
        for name in sorted(scripts):
            text = open(os.path.join(path, name + ".py")).read()
            for node in ast.walk(ast.parse(text)):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{folder}/{name} imports {n}" for n in names if n in scripts - {name}
                              or n == "benchmarking"]
            if re.search(r"sys\.path\.(insert|append)\(", text):
                offenders.append(f"{folder}/{name} edits sys.path")
    assert not offenders, offenders


def python_lines(*folders):
    return sum(len(open(os.path.join(root, name)).read().splitlines()) for folder in folders
               for root, _, names in os.walk(os.path.join(REPO, folder)) for name in names if name.endswith(".py"))


def test_the_benchmarks_stay_under_a_fifth_of_the_code():
    """benchmarks/ holds the studies still in use; a study whose question
    is answered leaves the tree (its result stays in docs/ with the commit
    that holds it), so the measurements do not outgrow what they measure."""
    benchmarks = python_lines("benchmarks")
    rest = python_lines("fairseq_hybrid", "scripts", "recipes")
    assert benchmarks / (benchmarks + rest) < 0.20, (benchmarks, rest)


def test_the_package_root_holds_a_handful_of_modules():
    """Everything else lives in a room (a folder) that says what it is: a new
    module at the root must earn its place here."""
    root = sorted(name for name in os.listdir(PACKAGE) if name.endswith(".py"))
    assert root == ["__init__.py", "__main__.py", "fairseq_root_logging.py", "hybrid_group.py"]
