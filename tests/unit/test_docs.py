"""The documentation can't drift: the configuration reference is what the models say, the site
builds as ``mkdocs build --strict`` does (a broken link or anchor fails it; in this process, a
few seconds), every page is in the nav, and every ``docs/...`` link in the README names a file
that exists."""

from __future__ import annotations

import re
import typing

import pytest
import yaml
from pydantic import BaseModel

from core.config import PipelineConfig
from tests.conftest import ROOT, load_script


@pytest.fixture(scope="module")
def reference():
    return load_script("config_reference")


def _leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
    """(key path, FieldInfo) of every value below ``model``, found without the script's own walk."""
    out = []
    for name, field in model.model_fields.items():
        subs = [a for a in (field.annotation, *typing.get_args(field.annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)]
        out += _leaves(subs[0], f"{prefix}{name}.") if subs else [(f"{prefix}{name}", field)]
    return out


def _rows(text: str) -> dict[str, list[str]]:
    """Key path -> the cells of its table row on the page."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| \[?`([\w.]+)`\]?(?:\(#[\w-]+\))? \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
    return rows


def test_the_committed_configuration_reference_is_what_the_models_say(reference):
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert reference.render() == committed, "run: python scripts/config_reference.py"


def test_every_key_of_the_config_is_listed_with_its_type_and_default(reference):
    rows = _rows((ROOT / "docs" / "configuration.md").read_text())
    leaves = _leaves(PipelineConfig)
    listed = [r["key"] for r in reference.walk(PipelineConfig) if r["model"] is None]
    assert len(leaves) > 100 and sorted(k for k, _ in leaves) == sorted(listed)
    missing = [k for k, _ in leaves if k not in rows]
    assert not missing, missing
    for key, field in leaves:
        type_, default = rows[key][0], rows[key][1]
        assert type_ and default, key
        if key in reference.DERIVED:  # computed from other keys (registry.model_name: the name)
            assert default == reference.DERIVED[key], key
        elif field.is_required():
            assert default == "**required**", key
        elif field.default_factory is None and isinstance(field.default, (int, float, str)):
            shown = str(field.default).lower() if isinstance(field.default, bool) else str(field.default)
            assert default == f"`{shown}`", (key, default)
    assert rows["training.early_stopping.patience"][:2] == ["int \\| null", "`null`"]
    assert rows["training.strategy"][0].startswith('"single" \\| "ddp"')
    assert rows["dataset.dvc_file"][1] == "`<dataset.path>.dvc`"


def test_described_keys_exist(reference):
    # A line in NOTES or DERIVED for a key the models no longer have is a stale line.
    keys = {r["key"] for r in reference.walk(PipelineConfig)}
    assert not (set(reference.NOTES) | set(reference.DERIVED)) - keys


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _anchors(page) -> set[str]:
    """The ids mkdocs gives the headings of a markdown page (its toc slugs), fenced code left out."""
    import html

    from markdown import markdown
    from markdown.extensions.toc import slugify

    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+ (.+)", line)):
            out.add(slugify(html.unescape(re.sub(r"<[^>]+>", "", markdown(m.group(1)))), "-"))
    return out


def test_every_page_is_in_the_nav_and_every_readme_docs_link_resolves():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(_nav_pages(config["nav"])) == pages
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]*))?\)", (ROOT / "README.md").read_text())
    assert len(links) >= 10
    assert not [path for path, _ in links if not (ROOT / path).is_file()]
    broken = [f"{path}#{anchor}" for path, anchor in links if anchor and anchor not in _anchors(ROOT / path)]
    assert not broken


def test_the_site_builds_strict(tmp_path, monkeypatch, caplog):
    # mkdocs and mkdocs-material come from the dev lock (`make install`).
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # mkdocs-material's banner about its successor
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    try:
        build(config)
    except Abort as exc:
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        pytest.fail(f"mkdocs build --strict: {exc}: {warnings}")
    assert (tmp_path / "site" / "configuration.html").is_file()
