"""The packages' layering (docs/layout.md): each package imports only the packages its row
allows, lazy imports inside functions included, so the graph between packages has no
cycle. A family's folder (``families/<name>/``) is its own node: the registry
(``families/`` itself) is low, the folders sit on top and nothing imports them but the
registry's lazy ``"module:attribute"`` references."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "megatron_mm"
# The registry's own modules; every other entry of families/ is a family's folder.
REGISTRY = {"__init__", "registry", "record", "encoder", "errors", "model_spec", "flags"}

GROUND = {"config", "quiet", "te_import", "runtime_patches"}
# what training/'s nodes above its configs may import from the rest of the package
LOWER = GROUND | {"startup", "plan", "data", "families", "models", "runtime"}
TRAINING = {"training", "training/cli", "training/rank_print", "training/checkpoint",
            "training/config", "training/assembly", "training/planning", "training/separate",
            "training/loop", "training/errors", "training/pretrain", "training/run_config",
            "training/run_context", "training/main"}
ALLOWED = {
    "config": set(),
    "quiet": set(),
    "te_import": set(),
    "runtime_patches": set(),
    "startup": {"runtime_patches", "quiet", "te_import"},
    "patches": {"runtime_patches"},  # the old name, deprecated
    "prepared": {"startup"},
    "plan": {"config"},
    "reproductions": {"config", "plan"},
    "data": GROUND | {"startup"},
    "families": {"config", "plan"},
    "models": GROUND | {"startup", "plan", "families"},
    "runtime": GROUND | {"startup", "plan", "families"},
    # training/ by concern, lowest first: its subpackages and top modules are nodes
    "training": {"startup"},
    "training/rank_print": set(),
    "training/checkpoint": GROUND | {"startup", "data", "families", "models"},
    "training/config": GROUND | {"startup", "plan", "data", "families", "training/checkpoint"},
    "training/assembly": LOWER | {"training/config", "training/checkpoint",
                                  "training/rank_print"},
    "training/planning": LOWER | {"training/config", "training/assembly"},
    "training/separate": LOWER | {"training/assembly", "training/planning"},
    # one run's assembly before any process group: every entry point builds it
    "training/run_context": LOWER | {"training/config", "training/checkpoint",
                                     "training/assembly", "training/planning"},
    "training/loop": LOWER | {"training/config", "training/checkpoint", "training/assembly",
                              "training/planning", "training/separate", "training/rank_print",
                              "training/run_context"},
    "training/errors": GROUND | {"data", "models", "runtime", "training/checkpoint",
                                 "training/loop"},
    "training/pretrain": {"training/config", "training/loop"},
    "training/run_config": {"training/cli", "training/config"},  # the old place, deprecated
    # the training script's main(): parse, train, report errors, shut down
    "training/main": {"startup", "training/cli", "training/config", "training/assembly",
                      "training/errors", "training/pretrain"},
    "training/cli": GROUND | {"startup", "families", "plan", "training/config",
                              "training/checkpoint", "recipes"},
    # recipes: typed RunConfigs (the cli's --recipe reads them)
    "recipes": GROUND | {"data", "families", "training/config"},
    # the converter states its config as typed values: nothing of the command line
    "hf": GROUND | {"startup", "plan", "data", "families", "models", "training",
                    "training/checkpoint", "training/config", "training/assembly",
                    "training/planning", "training/errors", "training/run_context"},
    "megatron_lm": LOWER | TRAINING | {"hf"},
    "families/*": GROUND | {"startup", "plan", "data", "families", "models", "runtime",
                            "hf"},
}


def node_of(parts):
    """The layering node of a module (its dotted name's parts, ``megatron_mm`` first)."""
    if len(parts) == 1:
        return "<package>"
    if parts[1] == "training" and len(parts) > 2:
        return f"training/{parts[2]}"
    if parts[1] == "families" and len(parts) > 2 and parts[2] not in REGISTRY:
        return "families/*"
    return parts[1]


def imports():
    """(importing node, imported node, module) for every import between two nodes."""
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[:-1]  # a module's package; an __init__'s own
        if parts[-1] == "__init__":
            parts = parts[:-1]
        source = node_of(parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    names = [base + (node.module.split(".") if node.module else [])]
                else:
                    names = [(node.module or "").split(".")]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".") for a in node.names]
            else:
                continue
            for name in names:
                if name[0] == "megatron_mm" and node_of(name) not in (source, "<package>"):
                    yield source, node_of(name), ".".join(parts)


def test_every_package_imports_only_what_its_row_allows():
    unknown = {s for s, _, _ in imports()} - set(ALLOWED) - {"<package>"}
    assert not unknown, f"packages without a row in ALLOWED: {sorted(unknown)}"
    wrong = sorted({f"{module} ({source}) imports {target}"
                    for source, target, module in imports()
                    if source in ALLOWED and target not in ALLOWED[source]})
    assert not wrong, "\n".join(wrong)


def test_the_allowed_graph_has_no_cycle():
    seen, done = set(), set()

    def visit(node, path):
        assert node not in seen - done, f"cycle: {' -> '.join(path + [node])}"
        if node in done:
            return
        seen.add(node)
        for target in ALLOWED[node]:
            visit(target, path + [node])
        done.add(node)

    for node in ALLOWED:
        visit(node, [])
