"""README's method table is generated from the registry and current; every method has a page."""

from __future__ import annotations

import pytest

from fedgraph_flwr import docs_tables
from fedgraph_flwr.algorithms import ALGORITHMS


def test_readme_method_table_is_current() -> None:
    text = docs_tables.README.read_text()
    assert docs_tables.readme_with_table(text) == text, (
        "README.md's method table is stale: run python -m fedgraph_flwr.docs_tables --write")


def test_every_registered_method_has_a_row_and_a_page() -> None:
    table = docs_tables.method_table()
    names = [name for name in ALGORITHMS if name not in docs_tables.TEST_FIXTURES]
    assert names, "no algorithm registered"
    for name in names:
        assert f"| `{name}` |" in table
        page = docs_tables.method_page(name)
        assert page.is_file(), f"{name} has no method page {page.relative_to(docs_tables.ROOT)}"
    for fixture in docs_tables.TEST_FIXTURES:
        assert f"| `{fixture}` |" not in table


def test_per_node_exemptions_are_marked_in_the_table() -> None:
    rows = {line.split("|")[1].strip(): line for line in docs_tables.method_table().splitlines()
            if line.startswith("| `")}
    for algo in docs_tables.documented_algorithms():
        for array in algo.trainer.per_node_arrays:
            assert f"`{array}`" in rows[f"`{algo.name}`"]


def test_a_stale_table_is_caught(tmp_path) -> None:
    readme = tmp_path / "README.md"
    stale = docs_tables.method_table().replace("| `fedavg` |", "| `fedavg-old` |")
    readme.write_text(f"# title\n\n{stale}\nafter\n")
    assert docs_tables.main(["--check", "--readme", str(readme)]) == 1
    assert docs_tables.main(["--write", "--readme", str(readme)]) == 0
    assert docs_tables.main(["--check", "--readme", str(readme)]) == 0
    assert readme.read_text().endswith("\nafter\n")


def test_a_readme_without_markers_is_refused(tmp_path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no table\n")
    with pytest.raises(ValueError, match="BEGIN/END"):
        docs_tables.readme_with_table(readme.read_text())
    assert docs_tables.main(["--check", "--readme", str(readme)]) == 2


def test_every_page_of_a_method_with_profiles_has_its_current_profiles_table(tmp_path) -> None:
    with_profiles = [algo for algo in docs_tables.documented_algorithms() if algo.options.profiles]
    assert len(with_profiles) == 18
    for algo in with_profiles:
        text = docs_tables.method_page(algo.name).read_text()
        assert docs_tables.page_with_profiles(text, algo) == text, (
            f"{algo.name}'s profiles table is stale: run python -m fedgraph_flwr.docs_tables --write")
        assert f"`{algo.options.profile_key()}`" in text and "## Reproduction profiles" in text
    # A stale page is caught and rewritten (the table only).
    pages = tmp_path / "methods"
    pages.mkdir()
    for algo in with_profiles:
        (pages / f"{algo.name}.md").write_text(docs_tables.method_page(algo.name).read_text())
    (pages / "fggp.md").write_text((pages / "fggp.md").read_text().replace("| adam |", "| sgd |"))
    readme = tmp_path / "README.md"
    readme.write_text(docs_tables.README.read_text())
    assert docs_tables.main(["--check", "--readme", str(readme), "--methods-dir", str(pages)]) == 1
    assert docs_tables.main(["--write", "--readme", str(readme), "--methods-dir", str(pages)]) == 0
    assert (pages / "fggp.md").read_text() == docs_tables.method_page("fggp").read_text()
