"""Docs that cannot drift: docs/design.md's module map names every module of the package and of kernels/ and nothing
else; docs/glossary.md defines the words the code's docstrings point to it for."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = ("fastspec", "kernels")  # the folders whose modules the map lists
ENTRY = re.compile(r"^( *)(\w+\.py|\w+/)(?:\s|$)")


def module_map() -> set[str]:
    """The module paths docs/design.md's module map lists: an entry is a line whose first word is a module or a
    folder, and a deeper-indented entry lies in the folder above it."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = text.split("## Module map", 1)[1].split("```")[1]
    listed, folders = set(), []  # folders: (indent, name) of the open folders, outermost first
    for line in block.splitlines():
        found = ENTRY.match(line)
        if not found:
            continue  # a description's continuation
        indent, name = len(found.group(1)), found.group(2)
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = "/".join([f for _, f in folders] + [name.rstrip("/")])
        if name.endswith("/"):
            folders.append((indent, name.rstrip("/")))
        elif path.split("/")[0] in MAPPED:
            listed.add(path)
    return listed


def package_modules() -> set[str]:
    """The modules git tracks under fastspec/ and kernels/ (a checkout without git: every .py file there)."""
    done = subprocess.run(["git", "ls-files", *(f"{d}/*.py" for d in MAPPED)], cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode == 0 and done.stdout.strip():
        return set(done.stdout.split())
    return {p.relative_to(ROOT).as_posix() for d in MAPPED for p in (ROOT / d).rglob("*.py")}


def test_the_module_map_lists_every_module_and_only_modules_that_exist():
    listed, modules = module_map(), package_modules()
    assert "fastspec/generate.py" in listed and "kernels/reference.py" in listed  # the parser reads the map
    assert sorted(modules - listed) == [], "modules missing from docs/design.md's module map"
    assert sorted(listed - modules) == [], "docs/design.md's module map lists modules that do not exist"


def test_the_glossary_defines_the_words_and_the_docstrings_point_to_it():
    glossary = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    defined = set(re.findall(r"^- \*\*([^*]+)\*\*", glossary, flags=re.MULTILINE))
    words = {"buffer", "root", "draft", "step", "caches", "features", "feature columns", "kept entries",
             "accepted tokens", "recovered token", "bonus token", "accepted length", "acceptance rate"}  # fmt: skip
    assert words - defined == set(), "docs/glossary.md lost a definition"
    pointing = [p for p in (ROOT / "fastspec").rglob("*.py") if "docs/glossary.md" in p.read_text(encoding="utf-8")]
    assert pointing, "no docstring points to docs/glossary.md"
