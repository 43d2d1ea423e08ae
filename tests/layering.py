#!/usr/bin/env python3
"""ftc's layering, read from the code (no module is imported); `make lint` runs it.

    python tests/layering.py [ROOT]        # ROOT: the project's root, by default this file's parent's parent

One line per problem and exit 1 when
- an import points the wrong way (LAYERS): runner/node/ is shipped whole to every node, so it imports
  nothing of provision/ or of the rest of runner/, nor a library only the controller has; provision/
  (the cluster side) imports nothing of runner/ but runner/node/ (the protocol both sides share);
- modules import each other in a cycle, function-level imports included (KNOWN_CYCLES apart);
- a function is longer than MAX_FUNCTION_LINES, in product code, tests or examples (LONG_FUNCTIONS apart);
- a module of provision/ or runner/ is longer than MAX_FILE_LINES (LONG_FILES apart).
"""

import ast
import sys
from pathlib import Path

PACKAGES = ("provision", "runner")
# Each layer and what it may import; a module is in the first layer its name falls under.
LAYERS = {
    "runner.node": {"runner.node"},
    "provision": {"provision", "runner.node"},
    "runner": {"runner", "provision", "runner.node"},
}
# ftc's own dependencies that no node stack brings (torch brings Jinja2, transformers PyYAML): a node
# program that imports one fails there.
CONTROLLER_LIBS = {"boto3", "botocore", "fabric", "invoke", "paramiko", "pathspec", "rich"}
# The cycles there are today, each closed by a function-level import. A new one, a module joining one, or
# an entry here that is no longer a cycle is a problem, so the list only shrinks.
KNOWN_CYCLES: list[set[str]] = []
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS: set[str] = set()  # "path:function" of each allowed longer one, held to the same rule; none today
PYTHON_DIRS = (*PACKAGES, "tests", "examples")
MAX_FILE_LINES = 600
LONG_FILES: set[str] = set()  # modules allowed past MAX_FILE_LINES: none today, and the list only shrinks


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def modules(root: Path) -> dict[str, Path]:
    """Every module of provision/ and runner/ by its dotted name (a package by its own)."""
    found = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The project's modules and the other top-level names that module `name` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    siblings = {m.rpartition(".")[2]: m for m in known if m.rpartition(".")[0] == package}
    project, other = set(), set()

    def resolve(target: str) -> None:
        for candidate in (target, target.rpartition(".")[0]):
            if candidate in known:
                project.add(candidate)
                return
        head = target.split(".")[0]
        if head in siblings:  # `import glue` in a program run beside glue.py
            project.add(siblings[head])
        elif head not in PACKAGES:
            other.add(head)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{prefix}.{alias.name}" if prefix else alias.name
                resolve(full if full in known else prefix)
    project.discard(name)
    return project, other


def layer_of(module: str) -> str:
    return next(layer for layer in LAYERS if in_package(module, layer))


def wrong_way(deps: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    """Each import that leaves its layer's allowance, and each controller library a node program imports."""
    found = []
    for module, (project, other) in sorted(deps.items()):
        allowed = LAYERS[layer_of(module)]
        for target in sorted(project):
            if not any(in_package(target, layer) for layer in allowed):
                found.append(f"{module} imports {target}: {layer_of(module)} may import only "
                             f"{', '.join(sorted(allowed))}")
        if layer_of(module) == "runner.node":
            for library in sorted(other & CONTROLLER_LIBS):
                found.append(f"{module} imports {library}, which nodes do not have: runner.node runs on them")
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other in a circle (strongly connected, more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                found.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def long_functions(root: Path) -> list[tuple[str, int, int]]:
    """("path:function", its line, its length) of each function over MAX_FUNCTION_LINES."""
    found = []
    for top in PYTHON_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append((f"{path.relative_to(root)}:{node.name}", node.lineno, length))
    return found


def long_files(root: Path) -> list[tuple[str, int]]:
    """(path, its lines) of each module of provision/ and runner/ over MAX_FILE_LINES."""
    lengths = ((str(path.relative_to(root)), len(path.read_text().splitlines())) for path in modules(root).values())
    return [(name, lines) for name, lines in lengths if lines > MAX_FILE_LINES]


def problems(root: Path, known_cycles: list[set[str]], allowed_long: set[str],
             allowed_long_files: frozenset[str] = frozenset()) -> list[str]:
    """Every breach of the layering under `root`, one line each, given the cycles, long functions and long
    files allowed; none when it holds."""
    known = modules(root)
    if not known:
        return [f"no provision/ or runner/ under {root}: give the project's root"]
    deps = {module: imports(module, path, known) for module, path in known.items()}
    found = wrong_way(deps)
    groups = cycles({module: project for module, (project, _) in deps.items()})
    found += [f"import cycle between {', '.join(sorted(group))}: make one of them stop importing the other"
              for group in groups if group not in known_cycles]
    found += [f"KNOWN_CYCLES lists {', '.join(sorted(group))}, no longer a cycle: remove it from tests/layering.py"
              for group in known_cycles if group not in groups]
    long = long_functions(root)
    found += [f"{name} (line {line}) is {length} lines, over {MAX_FUNCTION_LINES}: split it"
              for name, line, length in long if name not in allowed_long]
    found += [f"LONG_FUNCTIONS lists {name}, no longer over {MAX_FUNCTION_LINES} lines: remove it from tests/layering.py"
              for name in sorted(allowed_long - {name for name, _, _ in long})]
    files = long_files(root)
    found += [f"{name} is {lines} lines, over {MAX_FILE_LINES}: split it" for name, lines in files
              if name not in allowed_long_files]
    found += [f"LONG_FILES lists {name}, no longer over {MAX_FILE_LINES} lines: remove it from tests/layering.py"
              for name in sorted(allowed_long_files - {name for name, _ in files})]
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    found = problems(root, KNOWN_CYCLES, LONG_FUNCTIONS, frozenset(LONG_FILES))
    for problem in found:
        print(f"layering: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
