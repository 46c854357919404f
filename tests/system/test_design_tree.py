"""docs/DESIGN.md's module tree cannot fall behind the code (issue 34, item 5): every module
of mpc3/, protocols/, net/ and app/ is named in its top-level folder's part of the tree, and
every ``name.py`` the tree names exists there."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("mpc3", "protocols", "net", "app")


def _tree_sections() -> dict[str, str]:
    """Top-level folder -> its lines of the tree under '## Layers'."""
    block = (ROOT / "docs" / "DESIGN.md").read_text().split("## Layers", 1)[1].split("```")[1]
    sections, top = {}, None
    for line in block.splitlines():
        m = re.match(r"(\w+)/(\s|$)", line)
        if m:
            top = m.group(1)
        if top:
            sections[top] = sections.get(top, "") + line + "\n"
    return sections


def _modules(top: str) -> list[Path]:
    return sorted(f for f in (ROOT / top).rglob("*.py")
                  if f.name not in ("__init__.py", "__main__.py") and "_pb2" not in f.name)


def test_every_module_is_in_the_design_tree():
    sections = _tree_sections()
    assert set(TOPS) <= set(sections), sorted(sections)
    missing = []
    for top in TOPS:
        words = set(re.findall(r"\w+", sections[top]))
        missing += [str(f.relative_to(ROOT)) for f in _modules(top) if f.stem not in words]
    assert not missing, f"docs/DESIGN.md's tree does not name {missing}: add a line for each"


def test_every_file_the_tree_names_exists():
    stale = [f"{top}: {name}" for top, text in _tree_sections().items() if top in TOPS
             for name in re.findall(r"\w+\.py\b", text) if not list((ROOT / top).rglob(name))]
    assert not stale, f"docs/DESIGN.md's tree names files that are gone: {stale}"
