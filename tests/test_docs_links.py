"""Every relative link in the README and in docs/ leads to a file that
exists: the README points to pages by topic, and a page moved or renamed
must not leave a dead link behind."""

import glob
import os
import re

from conftest import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page):
    """(target, whether it exists) for each relative link of a Markdown page."""
    with open(page, encoding="utf-8") as f:
        targets = LINK.findall(f.read())
    for target in targets:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
        yield target, os.path.exists(path)


def test_every_relative_link_resolves():
    pages = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"),
                                                                 recursive=True))
    links = [(os.path.relpath(page, REPO), target, exists) for page in pages for target, exists in relative_links(page)]
    assert [link for link in links if not link[2]] == []
    assert len(links) >= 10  # the README's documentation table alone has 7


def test_a_dead_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](there.md) and [gone](gone.md#part), [web](https://example.org), [here](#top)\n")
    (tmp_path / "there.md").write_text("")
    assert list(relative_links(str(page))) == [("there.md", True), ("gone.md#part", False)]
