"""
The floor plan holds (docs/architecture.md): the import contracts pass, no app imports another
inside a function (except Celery's tasks.py), no module reaches for another module's private
names, and modules stay small enough to read.
"""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("config", "core", "tenants", "security", "web", "cloud", "provisioning", "storage", "billing", "webhooks",
        "operations")
MAX_LINES = 600
# The attestation verifier is one pure function's checks in the order a verifier reads them.
LONG_ALLOWED = {"security/attestation.py"}


def modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def test_the_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed (requirements-dev.txt)"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_app_imports_another_inside_a_function_outside_tasks():
    found = []
    for path in modules():
        if path.name == "tasks.py":
            continue
        own = path.relative_to(ROOT).parts[0]
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    app = node.module.split(".")[0]
                    if app in APPS and app != own:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert found == []


def test_no_module_uses_another_modules_private_names():
    found = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in APPS:
                found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}"
                          for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and isinstance(node.value, ast.Name) and node.value.id in imported_modules(tree)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert found == []


def imported_modules(tree) -> set[str]:
    """Names bound to the project's modules by ``from x import module`` or ``import x``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in APPS:
            for alias in node.names:
                if (ROOT / node.module.replace(".", "/") / f"{alias.name}.py").exists() or \
                        (ROOT / node.module.replace(".", "/") / alias.name / "__init__.py").exists():
                    names.add(alias.asname or alias.name)
    return names


@pytest.mark.parametrize("path", [p for p in modules() if str(p.relative_to(ROOT)) not in LONG_ALLOWED],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it by idea (at most {MAX_LINES})"
