"""The layer rule (DESIGN.md "Layers of the code"), from the package's own imports.

Parsed, not imported: a function-level (lazy) import counts the same as a
module-level one, so a circle cannot hide behind laziness."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mla_dcp"
# Kernel modules (Triton and Gluon) and the host helpers they may use.
KERNELS = {"mla_dcp.ops.triton_kernels.kernels", "mla_dcp.ops.triton_kernels.helpers",
           "mla_dcp.ops.gluon_kernels.seesaw", "mla_dcp.ops.gluon_kernels.narrow", "mla_dcp.ops.gluon_kernels.helpers"}
LAUNCH_LAYER = {"mla_dcp.ops.launchers", "mla_dcp.ops.launch_args", "mla_dcp.ops.fast_launch", "mla_dcp.ops.tiles"}
LEAVES = {"mla_dcp._shapes", "mla_dcp._dtypes"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path) -> set[str]:
    """mla_dcp modules ``path`` imports (``from mla_dcp.ops.triton_kernels import kernels``
    names the module mla_dcp.ops.triton_kernels.kernels where that file exists)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mla_dcp")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mla_dcp"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() or \
                    (PACKAGE.parent / sub.replace(".", "/") / "__init__.py").exists()
                found.add(sub if is_module else node.module)
    return found


GRAPH = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def closure(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read():
    assert "mla_dcp.ops.triton_kernels.kernels" in GRAPH["mla_dcp.ops.launchers"]
    assert "mla_dcp.pure" in GRAPH["mla_dcp.ops.library"]


def test_no_import_circle():
    circles = sorted(m for m in GRAPH if m in closure(m) and m != "mla_dcp" and not m.endswith("__init__"))
    # A package __init__ importing its own submodules is not a circle of code.
    circles = [m for m in circles if not all(
        path.startswith(m) or path == "mla_dcp" for path in _cycle_members(m))]
    assert circles == []


def _cycle_members(start: str) -> set[str]:
    return {m for m in closure(start) if start in closure(m)}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernels_import_no_launcher_no_registration_and_no_oracle(kernel):
    bad = {m for m in closure(kernel) if m.startswith(("mla_dcp.pure", "mla_dcp.ops.library", "mla_dcp.ops.launchers",
                                                       "mla_dcp.api", "mla_dcp.ops.tiles"))}
    assert bad == set(), f"{kernel} reaches {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(LAUNCH_LAYER | KERNELS))
def test_only_the_registrations_reach_the_oracle(module):
    assert not {m for m in closure(module) if m.startswith("mla_dcp.pure")}, module


def test_the_oracle_imports_no_op_and_the_leaves_import_nothing():
    for name, deps in GRAPH.items():
        if name.startswith("mla_dcp.pure"):
            assert not {d for d in deps if d.startswith("mla_dcp.ops") or d == "mla_dcp.api"}, name
    for leaf in LEAVES:
        assert GRAPH[leaf] == set(), leaf


def test_a_circle_would_be_caught(monkeypatch):
    """Negative control: a kernel importing its launcher is reported."""
    seesaw = "mla_dcp.ops.gluon_kernels.seesaw"
    monkeypatch.setitem(GRAPH, seesaw, GRAPH[seesaw] | {"mla_dcp.ops.launchers"})
    assert seesaw in closure(seesaw)
    with pytest.raises(AssertionError):
        test_kernels_import_no_launcher_no_registration_and_no_oracle(seesaw)


def _private_uses(path: pathlib.Path) -> set[str]:
    """``module._name`` reads and ``from module import _name`` of mla_dcp modules in ``path``."""
    tree = ast.parse(path.read_text())
    aliases, found = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mla_dcp"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if alias.name.startswith("_"):
                    found.add(f"{node.module}.{alias.name}")
                elif sub in GRAPH:
                    aliases[alias.asname or alias.name] = sub
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mla_dcp") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.add(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_kernel_modules_share_code_through_their_dialects_public_helpers():
    # One folder per dialect, its shared helpers public in one module: no kernel
    # module reads another's private names, and the two Gluon kernels do not
    # import each other.
    for kernel in KERNELS:
        path = PACKAGE.parent / (kernel.replace(".", "/") + ".py")
        assert _private_uses(path) == set(), kernel
    assert "mla_dcp.ops.gluon_kernels.seesaw" not in GRAPH["mla_dcp.ops.gluon_kernels.narrow"]
    assert "mla_dcp.ops.gluon_kernels.narrow" not in GRAPH["mla_dcp.ops.gluon_kernels.seesaw"]


def test_a_private_use_would_be_caught(tmp_path):
    """Negative control for the check above."""
    probe = tmp_path / "probe.py"
    probe.write_text("from mla_dcp.ops.gluon_kernels import helpers\nx = helpers._hidden\n"
                     "from mla_dcp.ops.launch_args import _capability\n")
    assert _private_uses(probe) == {"mla_dcp.ops.gluon_kernels.helpers._hidden", "mla_dcp.ops.launch_args._capability"}
