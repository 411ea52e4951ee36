"""The house's guards, over every package and root module of fsdpdoctor, imports inside functions
included: data flows one way (no import from a lower layer to a higher one), no import circle, and no
module hands on names it only imported (a re-export shim lets a renderer reach past results/)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fsdpdoctor"

# every unit of the package (a subpackage or a root module) and its layer; a unit imports only units of
# a lower layer, or itself. capture -> trace -> analysis -> diagnose -> results -> render, with the
# typed results and the engines below the code that builds them, and the front doors on top.
LAYERS = {
    "errors": 0, "units": 0, "version": 0, "hang_format": 0, "severity": 0, "visible_text": 0,
    "options": 0,
    "results": 1, "engines": 1, "capture": 1,
    "trace": 2,
    "analysis": 3,
    "diagnose": 4,
    "pipeline": 5, "hang_pipeline": 5.5,  # the hang pipeline reads the profiled steps through pipeline
    "report": 6,
    "tui": 7, "api": 7,
    "__init__": 8,
    "commands": 9,
    "cli": 10,
    "__main__": 11,
}
# faces: package __init__ files whose job is to hand on their submodules' names
FACES = {"fsdpdoctor/results/__init__.py", "fsdpdoctor/__init__.py", "fsdpdoctor/api.py", "fsdpdoctor/trace/__init__.py",
         "fsdpdoctor/capture/__init__.py", "fsdpdoctor/engines/__init__.py",
         "fsdpdoctor/analysis/dialects/__init__.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = ("fsdpdoctor",) + f.relative_to(PKG).with_suffix("").parts
        out[".".join(parts).removesuffix(".__init__")] = f
    return out


MODULES = _modules()


def _unit(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of fsdpdoctor in ``path``; ``from PKG import SUB`` counts
    as an import of the submodule PKG.SUB. Relative imports are resolved."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    me = ".".join(("fsdpdoctor",) + path.relative_to(PKG).with_suffix("").parts)
    out = []
    for n in nodes:
        if isinstance(n, ast.ImportFrom):
            module = n.module or ""
            if n.level:
                base = me.split(".")[:-n.level] if path.name != "__init__.py" else me.split(".")[:-n.level][:]
                module = ".".join(base + ([module] if module else []))
            names = [a.name for a in n.names]
            subs = [nm for nm in names if f"{module}.{nm}" in MODULES]
            for s in subs:
                out.append((n.lineno, f"{module}.{s}", []))
            rest = [nm for nm in names if nm not in subs]
            if rest or not subs:
                out.append((n.lineno, module, rest))
        elif isinstance(n, ast.Import):
            out.extend((n.lineno, a.name, []) for a in n.names)
    return [(line, m, names) for line, m, names in out if m == "fsdpdoctor" or m.startswith("fsdpdoctor.")]


def test_every_unit_has_a_layer():
    assert {_unit(m) for m in MODULES} <= set(LAYERS), {_unit(m) for m in MODULES} - set(LAYERS)


def test_layers_import_only_downstream():
    bad = []
    for module, path in MODULES.items():
        mine = _unit(module)
        for line, target, _ in _imports(path):
            theirs = _unit(target)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({mine}, layer {LAYERS[mine]}) imports {target} "
                           f"({theirs}, layer {LAYERS[theirs]})")
    assert not bad, "\n".join(bad)


def test_no_import_circles_imports_in_functions_included():
    graph = {m: {t for _, t, _ in _imports(p)} & set(MODULES) - {m} for m, p in MODULES.items()}
    # a package's __init__ is imported with any of its submodules: only the edges written count
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(n):] + [n]) if n in stack
                                     else f"import circle through {m} -> {n}")
            if n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    out = set()
    for n in ast.parse(path.read_text()).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Assign):
            out.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return out


def _module_aliases(tree: ast.Module, me: Path) -> dict[str, str]:
    """Local name -> fsdpdoctor module, for ``from fsdpdoctor.X import mod [as m]`` and ``import ... as m``."""
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("fsdpdoctor"):
            for a in n.names:
                if f"{n.module}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{n.module}.{a.name}"
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.asname and a.name in MODULES:
                    out[a.asname] = a.name
    return out


def test_result_types_come_from_results():
    """No re-export shims: every name results/ defines is imported from results/ (its module or the
    package's face), by the package, its tests, benchmarks and reference jobs, as a name or as an
    attribute of a module (``mem.MemoryConfig``): report/ and tui/ (and everyone else) reach the result
    types there, and no module of analysis/ or diagnose/ doubles as a face of results/."""
    results = {n for m, p in MODULES.items() if _unit(m) == "results" for n in _defined(p)}
    files = list(MODULES.values()) + [f for d in ("tests", "benchmarks", "reference_jobs")
                                      for f in sorted((ROOT / d).glob("*.py"))]
    bad = []
    for path in files:
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("fsdpdoctor.") \
                    and not n.module.startswith("fsdpdoctor.results") and n.module in MODULES:
                handed_on = [a.name for a in n.names if a.name in results and a.name not in _defined(MODULES[n.module])]
                if handed_on:
                    bad.append(f"{path.relative_to(ROOT)}:{n.lineno} imports {handed_on} from {n.module}")
        aliases = {k: v for k, v in _module_aliases(tree, path).items() if _unit(v) != "results"}
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases \
                    and n.attr in results and n.attr not in _defined(MODULES[aliases[n.value.id]]):
                bad.append(f"{path.relative_to(ROOT)}:{n.lineno} takes {n.attr} from {aliases[n.value.id]}")
    assert not bad, "\n".join(bad)


def test_no_module_hands_on_result_types():
    """The shims themselves: outside results/ a module imports a result type only to use it."""
    results = {n for m, p in MODULES.items() if _unit(m) == "results" for n in _defined(p)}
    bad = []
    for module, path in MODULES.items():
        if _unit(module) == "results" or path.relative_to(ROOT).as_posix() in FACES:
            continue
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}  # annotations are names too
        for n in ast.walk(tree):  # and a quoted annotation holds names
            ann = getattr(n, "annotation", None) if isinstance(n, (ast.AnnAssign, ast.arg)) else None
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
                used |= {x.id for x in ast.walk(ast.parse(ann.value, mode="eval")) if isinstance(x, ast.Name)}
        for n in tree.body:
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("fsdpdoctor.results"):
                for a in n.names:
                    if a.name in results and (a.asname or a.name) not in used:
                        bad.append(f"{path.relative_to(ROOT)}:{n.lineno} imports {a.name} and does not use it")
    assert not bad, "\n".join(bad)
