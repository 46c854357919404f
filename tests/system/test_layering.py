"""The folder tree is the architecture: imports point downward only (app -> net ->
protocols -> mpc3, and inside protocols/ and net/ from room to room as ROOMS says), there
are no import cycles, and no source file outside tests and benchmarks grows past ~500 lines
without saying why at its top."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["mpc3", "protocols", "net", "app"]          # each may import only those before it
MAX_LINES = 500


def _modules():
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if "proto" in path.relative_to(ROOT).parts[:2] and path.name.endswith("_pb2.py") \
                    or path.name.endswith("_pb2_grpc.py"):
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(name: str, path: Path) -> set[str]:
    """Modules of this repository imported anywhere in the file (also inside functions)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in LAYERS}


MODULES = dict(_modules())
GRAPH = {name: {m for m in _imports(name, path) if m in MODULES and m != name}
         for name, path in MODULES.items()}


def test_imports_point_downward():
    bad = []
    for name, deps in GRAPH.items():
        mine = LAYERS.index(name.split(".")[0])
        for d in deps:
            if LAYERS.index(d.split(".")[0]) > mine:
                bad.append(f"{name} imports {d}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


#: the rooms of protocols/ and net/, each with the rooms of its own folder it may import;
#: modules directly in protocols/ or net/ (and net/proto/) form the room named by the folder
ROOMS = {
    "protocols": set(),
    "protocols.model": {"protocols"},
    "protocols.layers": {"protocols", "protocols.model"},
    "protocols.stacks": {"protocols", "protocols.model", "protocols.layers"},
    "protocols.calibration": {"protocols", "protocols.model", "protocols.layers",
                              "protocols.stacks"},
    "protocols.jobs": {"protocols", "protocols.model", "protocols.layers", "protocols.stacks",
                       "protocols.calibration"},
    "net": set(),                       # with net/proto/
    "net.peer": {"net"},
    "net.party": {"net", "net.peer"},
    "net.client": {"net"},
}


def _room(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] not in ("protocols", "net"):
        return None
    return ".".join(parts[:2]) if ".".join(parts[:2]) in ROOMS else parts[0]


def test_every_module_is_in_a_room():
    """A new sub-folder of protocols/ or net/ is a new room: it gets its line in ROOMS."""
    dirs = {str(p.parent.relative_to(ROOT)).replace("/", ".")
            for top in ("protocols", "net") for p in (ROOT / top).rglob("__init__.py")}
    assert not sorted(d for d in dirs if d not in ROOMS and d != "net.proto"), \
        "a package of protocols/ or net/ is in no room of tests/system/test_layering.py's ROOMS"


def test_rooms_import_downward():
    bad = []
    for name, deps in GRAPH.items():
        room = _room(name)
        for d in deps:
            there = _room(d)
            if room is None or there is None or there == room or \
                    there.split(".")[0] != room.split(".")[0]:
                continue                        # between top folders: LAYERS decides
            if there not in ROOMS[room]:
                bad.append(f"{name} ({room}) imports {d} ({there})")
    assert not bad, "imports between rooms against ROOMS:\n" + "\n".join(sorted(bad))


def test_the_benchmark_harness_does_not_import_the_cli():
    """app/cli runs app/bench's commands, so the harness may not import app/cli back (what
    both need lives below them, e.g. app/options.py)."""
    bad = sorted(f"{n} imports {d}" for n, deps in GRAPH.items() if n.startswith("app.bench")
                 for d in deps if d == "app.cli" or d.startswith("app.cli."))
    assert not bad, "app/bench imports app/cli:\n" + "\n".join(bad)


def test_the_tamper_harness_stays_out_of_party_code():
    """mpc3/tamper.py makes a party cheat (issue 35's tests and baseline): no module of the
    layers imports it; only tests and benchmarks do."""
    bad = sorted(n for n, deps in GRAPH.items() if "mpc3.tamper" in deps)
    assert not bad, "modules importing the tamper harness: " + ", ".join(bad)


def test_no_import_cycles():
    """Module-level and function-level imports together: a cycle through a function-local
    import is still a knot in the design, and so is a submodule importing names from its
    own package's __init__ (``from . import sibling`` in a package that imports it)."""
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(GRAPH[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_modules_stay_small_or_say_why():
    long = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and "Why this module is long" not in "\n".join(lines[:40]):
            long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
    assert not long, ("modules over ~500 lines without a reason stated at their top "
                      "('Why this module is long: ...'):\n" + "\n".join(long))


#: modules that may import torch (the optional [train] extra); nothing imports them in turn
TORCH_MODULES = {"protocols.model.torch_ref"}


def test_torch_stays_optional():
    """Only TORCH_MODULES import torch, and no module of the layers imports those: mpc3,
    its protocols, parties and CLI run without torch installed."""
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if any(m.split(".")[0] == "torch" for m in mods) and name not in TORCH_MODULES:
            bad.append(f"{name} imports torch")
        bad += [f"{name} imports {d}" for d in GRAPH[name]
                if any(d == t or d.startswith(t + ".") for t in TORCH_MODULES)]
    assert not bad, "\n".join(sorted(bad))
