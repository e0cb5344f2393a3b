"""report.html (per run and per grid) and the figures it shows: self-contained pages with
the headline figures, tables and embedded images, rendered by a real browser."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.experiments import run_grid, write_tables
from fedgraph_flwr.plots import matrix_caption
from fedgraph_flwr.report import pct, write_run_report

TINY = {"dataset": "SBM", "num-clients": 3, "rounds": 2, "hidden": 8}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> dict:
    """A 2-round FedAux run (it writes similarity and weight heatmaps)."""
    root = tmp_path_factory.mktemp("run")
    results = run_federation({**TINY, "algorithm": "fedaux", "data-root": str(root / "data"),
                              "output-dir": str(root / "out"), "run-name": "tiny"})
    return {"results": results, "out": root / "out" / "tiny"}


@pytest.fixture(scope="module")
def tiny_grid(tmp_path_factory) -> Path:
    """2 algorithms × 2 seeds through the experiment runner."""
    root = tmp_path_factory.mktemp("grid")
    spec = {"name": "tiny-grid", "base": {**TINY, "data-root": str(root / "data")},
            "grid": {"algorithm": ["fedavg", "local"]}, "seeds": [0, 1], "paper": {}}
    return run_grid(spec, root / "exp", None, "inprocess", {})


def external_references(html: str) -> list[str]:
    """Every src/href that would make a browser fetch something (all but data: URIs and
    links to files beside the page), and any URL at all in the text."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", html)
    fetched = [r for r in refs if not r.startswith("data:") and (":" in r or r.startswith("/"))]
    return fetched + re.findall(r"(?:https?:)?//[\w.-]+\.\w+", re.sub(r"data:[^\"']+", "", html))


def test_heatmap_captions_state_the_range_and_uniform_mixing():
    assert matrix_caption("weights", np.full((4, 4), 0.25)) == (
        "uniform mixing: every weight = 1/4", (0.0, 0.5))
    near = np.full((10, 10), 0.1) + 1e-6 * np.eye(10)
    caption, limits = matrix_caption("phase.mixing", near)
    assert caption.startswith("uniform mixing: every weight = 1/10 (all within ±") and limits
    similarity = np.array([[1.0, 0.9999], [0.9999, 1.0]])
    caption, limits = matrix_caption("similarity", similarity)
    assert caption == "near-uniform (no structure at this scale):\nevery similarity in " \
        "0.99990–1.00000" and limits == pytest.approx((-0.00005, 1.99995))
    assert matrix_caption("similarity.2", similarity)[0].startswith("near-uniform")
    assert matrix_caption("similarity", np.array([[1.0, 0.6], [0.6, 1.0]])) == (
        "range 0.60–1.00", None)
    spread = np.array([[0.7, 0.3], [0.3, 0.7]])
    assert matrix_caption("weights", spread) == ("range 0.30–0.70", None)


@pytest.mark.slow
def test_run_report_holds_headline_clients_images_and_nothing_external(tiny_run):
    results, out = tiny_run["results"], tiny_run["out"]
    html = (out / "report.html").read_text()
    final = results["final"]
    assert f">{pct(final['test_at_best_val'])}<" in html
    assert "<th>best-val round</th>" in html
    for cid, pc in final["per_client"].items():
        assert f"<td class=l>{cid}</td>" in html and pct(pc["test"]) in html
    # curves, costs and both heatmaps, inline
    assert html.count('src="data:image/png;base64,') == 4
    assert {"heatmap_similarity.png", "heatmap_weights.png"} <= {p.name for p in out.iterdir()}
    assert "fedaux-alpha" in html and "fedpub-tau" not in html  # its own config keys only
    assert external_references(html) == []


@pytest.mark.slow
def test_run_report_escapes_text(tiny_run, tmp_path):
    results = copy.deepcopy(tiny_run["results"])
    results["config"]["run-name"] = "<script>alert(1)</script>"
    html = write_run_report(results, tmp_path).read_text()
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.slow
def test_grid_report_tabulates_cells_and_links_every_run(tiny_grid):
    html = (tiny_grid / "report.html").read_text()
    assert "fedavg|SBM|metis|3" in html and "local|SBM|metis|3" in html
    assert html.count(" ± ") >= 4  # mean ± std over the two seeds, per cell
    runs = sorted(p.parent.name for p in tiny_grid.glob("*/results.json"))
    assert len(runs) == 4
    for name in runs:
        assert f'href="{name}/report.html"' in html and (tiny_grid / name / "report.html").is_file()
    assert html.count('src="data:image/png;base64,') >= 2  # curves, per-client bars
    assert external_references(html) == []
    # A grid of runs that predate report.html: `report` writes their pages.
    (tiny_grid / runs[0] / "report.html").unlink()
    write_tables(tiny_grid)
    assert (tiny_grid / runs[0] / "report.html").is_file()


def screenshot(page: Path, png: Path) -> Path:
    """``page`` rendered by headless Chromium, 1280 px wide."""
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={png.parent / 'chromium-profile'}", f"--screenshot={png}",
                    "--window-size=1280,2000", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    return png


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="chromium not on PATH (Debian: apt-get install -y chromium)")
@pytest.mark.slow
def test_reports_render_in_headless_chromium(tiny_run, tiny_grid, tmp_path):
    from PIL import Image

    for page in (tiny_run["out"] / "report.html", tiny_grid / "report.html"):
        png = screenshot(page, tmp_path / f"{page.parent.name}.png")
        with Image.open(png) as image:
            assert image.size == (1280, 2000)
            colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        # A blank page is one colour; text, tables and figures give thousands.
        assert colours is not None and len(colours) > 100, f"{page} rendered nearly blank"


@pytest.mark.smoke
def test_headline_cards_name_their_protocol_and_the_data_root_used_is_shown(tmp_path, monkeypatch):
    """Each headline card says which evaluation protocol it is, linked to its definition
    on the page (taken from engine/protocols.py) and to the docs where the run sits in a
    checkout; the page shows the data root the run read, also when the config's
    data-root is "" and the root came from FEDGRAPH_DATA_ROOT."""
    from fedgraph_flwr.report import protocol_definitions

    data = tmp_path / "datasets"
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(data))
    checkout = tmp_path / "checkout"
    (checkout / "docs").mkdir(parents=True)
    (checkout / "docs" / "running.md").write_text("## Evaluation protocol\n")
    results = run_federation({**TINY, "algorithm": "fedavg", "rounds": 1,
                              "output-dir": str(checkout / "outputs"), "run-name": "env-root"})
    assert results["config"]["data-root"] == ""
    assert results["data_root"] == {"path": str(data), "source": "data root from env FEDGRAPH_DATA_ROOT"}
    html = (checkout / "outputs" / "env-root" / "report.html").read_text()
    assert html.count('protocol: <a href="#protocol-held">held</a>') == 3  # headline, round, per client
    assert set(protocol_definitions()) == {"held", "pooled"}
    for name, text in protocol_definitions().items():
        assert f'<li id="protocol-{name}"><b>{name}</b>: ' in html and len(text) > 40
    assert '<a href="../../docs/running.md#evaluation-protocol">' in html
    assert f"data root used: <code>{data}</code>" in html and "env FEDGRAPH_DATA_ROOT" in html
    assert external_references(html) == []
    # Outside a checkout (the Flower app bundle has no docs/): the page says where, no link.
    elsewhere = write_run_report(results, tmp_path / "elsewhere").read_text()
    assert "docs/running.md, section Evaluation protocol" in elsewhere and "../docs" not in elsewhere
