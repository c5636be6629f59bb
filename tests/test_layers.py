"""The package's layers: every import inside qbackend/ goes down (or stays in its layer), as the
order in qbackend's package docstring says; imports of qbackend modules are at module level (none
inside a function, which is how a cycle is dodged); no private name is imported from another
package (the compiled extension `_C` excepted); every provider name list comes from the registry."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import qbackend
from qbackend.ops import registry

ROOT = Path(qbackend.__file__).parent
LAYER_LINE = re.compile(r"^\s*(\d+) (\w+)\s+(.+?)\s{2,}\S")


def documented_layers() -> dict[str, int]:
    """top-level name under qbackend/ -> its layer number, from the package docstring."""
    layers = {}
    for line in qbackend.__doc__.splitlines():
        m = LAYER_LINE.match(line)
        if m:
            for name in m.group(3).split(","):
                assert name.strip() not in layers, f"{name.strip()} listed twice"
                layers[name.strip()] = int(m.group(1))
    return layers


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        module = ["qbackend", *(parts[:-1] if is_pkg else parts)]
        yield path, module, is_pkg


def _imports(tree: ast.AST, module: list[str], is_pkg: bool):
    """(line, target module parts, imported names, inside a function) of each qbackend import."""
    package = module if is_pkg else module[:-1]

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[:len(package) - (child.level - 1)]
                    target = base + (child.module.split(".") if child.module else [])
                else:
                    target = (child.module or "").split(".")
                if target and target[0] == "qbackend":
                    yield child.lineno, target, [a.name for a in child.names], in_function
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    target = alias.name.split(".")
                    if target[0] == "qbackend":
                        yield child.lineno, target, [], in_function
            yield from visit(child, fn)

    yield from visit(tree, False)


def _top(parts: list[str]) -> str:
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_name_has_a_layer():
    layers = documented_layers()
    names = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    names |= {"_C"}
    assert names == set(layers), f"undocumented: {sorted(names - set(layers))}; gone: {sorted(set(layers) - names)}"
    assert sorted(set(layers.values())) == list(range(1, max(layers.values()) + 1))


def test_imports_go_down_and_stay_at_module_level():
    layers = documented_layers()
    problems = []
    for path, module, is_pkg in _modules():
        src = _top(module)
        tree = ast.parse(path.read_text())
        for line, target, names, in_function in _imports(tree, module, is_pkg):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            tops = {_top(target)} if len(target) > 1 or not names else {_top(["qbackend", n]) for n in names}
            for dst in tops:
                if layers[dst] > layers[src]:
                    problems.append(f"{where}: {src} (layer {layers[src]}) imports {dst} (layer {layers[dst]})")
            if in_function:
                problems.append(f"{where}: a qbackend import inside a function ({'.'.join(target)})")
            if _top(target) != src or len(target) < 2:
                private = [p for p in target[2:] if p.startswith("_")] + [n for n in names if n.startswith("_")
                                                                             and n != "_C"]
                if private:
                    problems.append(f"{where}: {src} imports private {private} of {'.'.join(target)}")
    assert not problems, "\n".join(problems)


def _string_collections(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            yield node.lineno, values


@pytest.mark.parametrize("family", sorted(registry.FAMILIES))
def test_provider_names_come_from_the_registry(family):
    """No module lists provider names itself: a tuple / list / set literal naming two or more
    providers would be a second registry."""
    names = registry.all_names()
    found = []
    for path, _, _ in _modules():
        for line, values in _string_collections(ast.parse(path.read_text())):
            if len([v for v in values if v in names]) >= 2:
                found.append(f"{path.relative_to(ROOT.parent)}:{line}: {values}")
    assert not found, "\n".join(found)


def test_every_accepted_provider_name_is_the_registrys(monkeypatch):
    from qbackend.dispatch import env_forced
    from qbackend.dispatch.tune_cache import _result_problem

    for name in registry.provider_names("kernel"):
        assert qbackend.QuantConfig(provider=name).provider == name
        monkeypatch.setenv("QBACKEND_PROVIDER", name)
        assert env_forced() == name
    for name in registry.provider_names("embedding"):
        assert qbackend.EmbeddingConfig(provider=name).provider == name
    for bad in ("mkldnn", "native ", "Native", *(n for n in registry.all_names()
                                                 if n not in registry.provider_names("kernel"))):
        with pytest.raises(ValueError, match="provider"):
            qbackend.QuantConfig(provider=bad)
        monkeypatch.setenv("QBACKEND_PROVIDER", bad.strip() + "x")
        with pytest.raises(ValueError, match="QBACKEND_PROVIDER"):
            env_forced()
    with pytest.raises(ValueError, match="EmbeddingConfig.provider"):
        qbackend.EmbeddingConfig(provider="onednn")
    known = registry.all_names()
    for name in known:
        assert _result_problem({"provider": name, "times_us": {name: 1.0}}, known) is None
    assert "unknown provider" in _result_problem({"provider": "mkl", "times_us": {"mkl": 1.0}}, known)
