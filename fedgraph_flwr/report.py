"""report.html: one self-contained page per run and per grid.

Everything a browser needs is inside the file (inline CSS, figures as PNG data URIs), so
a report opens offline, from an archive or an e-mail, and never fetches anything. All
text from results and configs is escaped. The run page is written next to results.json
each time the engine writes results; it reuses the PNGs already drawn there (costs,
heatmaps) and draws one figure more, the per-round curves.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .atomic import atomic_write

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 color:#1d2330;background:#f4f5f7;margin:0}
main{max-width:1180px;margin:0 auto;padding:20px 28px 40px}
h1{font-size:24px;margin:4px 0 2px}h2{font-size:18px;margin:28px 0 10px;
 border-bottom:2px solid #d8dce3;padding-bottom:4px}
.sub{color:#5a6272;margin:0 0 14px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:10px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px 14px}
.card .label{color:#5a6272;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
.card .value{font-size:26px;font-weight:600;font-variant-numeric:tabular-nums}
.card .note{color:#5a6272;font-size:12px}
.card.main{border-color:#2f6fd1;box-shadow:inset 4px 0 0 #2f6fd1}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e7;font-size:13px;
 font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid #eceef2;text-align:right;white-space:nowrap}
th{background:#eef0f4;font-weight:600;white-space:normal;vertical-align:bottom}
.scroll{overflow-x:auto;max-width:100%}
td.l,th.l{text-align:left}
tr:hover td{background:#f6f8fb}
.bar{display:inline-block;height:9px;background:#2f6fd1;border-radius:2px;margin-right:6px;
 vertical-align:middle}
figure{margin:0;background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:8px;
 display:inline-block;vertical-align:top;margin:0 10px 10px 0}
figure img{display:block;max-width:100%;height:auto}
figcaption{color:#5a6272;font-size:12px;padding-top:4px}
.pair{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:10px}
.pair figure{margin:0}
.cfg{columns:3 300px;column-gap:24px;font:12px/1.5 ui-monospace,"DejaVu Sans Mono",monospace;
 background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px 14px}
.cfg div{break-inside:avoid}.cfg .k{color:#5a6272}.cfg .changed{font-weight:700;color:#0b4aa8}
.muted{color:#5a6272}a{color:#0b4aa8}
"""


# --- small HTML pieces -------------------------------------------------------------------
def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def pct(x: Any) -> str:
    """A percentage figure as the tables print it, or an en dash when there is none."""
    v = _num(x)
    return f"{v:.2f}" if math.isfinite(v) else "–"


def png_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figure(data: bytes, caption: str) -> str:
    return (f'<figure><img alt="{escape(caption)}" src="{png_uri(data)}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def card(label: str, value: str, note: str = "", main: bool = False, protocol: str = "") -> str:
    """One headline card; ``protocol`` names the evaluation protocol the figure comes from,
    linked to its definition on the page (:func:`protocols_block`)."""
    link = (f'<div class="note">protocol: <a href="#protocol-{escape(protocol)}">'
            f"{escape(protocol)}</a></div>" if protocol else "")
    return (f'<div class="card{" main" if main else ""}"><div class="label">{escape(label)}</div>'
            f'<div class="value">{escape(value)}</div><div class="note">{escape(note)}</div>{link}</div>')


#: Where the evaluation protocols are documented, from the project's root.
PROTOCOLS_DOC = Path("docs") / "running.md"
PROTOCOLS_ANCHOR = "evaluation-protocol"


def protocol_definitions() -> dict[str, str]:
    """Each evaluation protocol's definition, read from the bullets of
    ``engine/protocols.py``'s docstring (one text, not a copy kept here)."""
    from .engine import protocols

    bullets = re.finditer(r"^- ``(\w+)``: (.*?)(?=^- ``|^\S|\Z)", protocols.__doc__ or "", re.M | re.S)
    return {m[1]: " ".join(m[2].split()) for m in bullets}


def protocols_block(run_dir: Path) -> str:
    """The protocols the headline cards link to, and the page that documents them: a
    relative link where this run's folder sits inside a checkout of the project (docs/
    is not in the Flower app bundle), else its path in the repository."""
    docs = next((parent / PROTOCOLS_DOC for parent in Path(run_dir).resolve().parents
                 if (parent / PROTOCOLS_DOC).is_file()), None)
    if docs is not None:
        href = quote(os.path.relpath(docs, Path(run_dir).resolve())) + f"#{PROTOCOLS_ANCHOR}"
        where = f'<a href="{escape(href)}">{escape(str(PROTOCOLS_DOC))}, Evaluation protocol</a>'
    else:
        where = f"the project's {escape(str(PROTOCOLS_DOC))}, section Evaluation protocol"
    items = "".join(f'<li id="protocol-{escape(name)}"><b>{escape(name)}</b>: {escape(text)}</li>'
                    for name, text in protocol_definitions().items())
    return f"<ul>{items}</ul><p class=muted>More: {where}.</p>"


def table(header: list[str], rows: Iterable[list[str]], left: int = 1, raw: bool = False) -> str:
    """An HTML table; the first ``left`` columns align left (names), the rest right
    (numbers). Cells are escaped unless ``raw`` (cells already HTML, e.g. links)."""
    def cells(tag: str, values: list[str]) -> str:
        return "".join(f'<{tag}{" class=l" if i < left else ""}>'
                       f"{v if raw else escape(str(v))}</{tag}>" for i, v in enumerate(values))

    body = "".join(f"<tr>{cells('td', list(r))}</tr>" for r in rows)
    head = cells("th", [escape(h) for h in header] if raw else header)
    return (f"<div class=scroll><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            "</table></div>")


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{body}</main></body></html>\n")


def _write(path: Path, text: str) -> Path:
    data = text.encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data))
    return path


def _png(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


# --- one run -----------------------------------------------------------------------------
def run_title(config: dict[str, Any], rounds: int) -> tuple[str, str]:
    title = f"{config.get('algorithm')} on {config.get('dataset')}"
    sub = (f"{config.get('partition')} partition · {config.get('num-clients')} clients · "
           f"{rounds} of {config.get('rounds')} rounds · seed {config.get('seed')} · "
           f"run {config.get('run-name')}")
    return title, sub


def headline_cards(results: dict[str, Any]) -> str:
    """The figures a reader looks for first: the headline, its round, the per-client
    figure, FedSpray's pooled figures when the run has them, and the run's totals."""
    final = results.get("final", {})
    metric = final.get("metric", "accuracy")
    n = len(results.get("rounds", []))
    evaluated, total = final.get("clients_evaluated"), final.get("clients")
    over = ("all clients' held models" if evaluated is None or total is None
            or evaluated >= total
            else f"the held models of the {evaluated} of {total} clients ever sampled")
    cards = [
        card(f"test {metric} @ best val (%)", pct(final.get("test_at_best_val")),
             f"mean over {over}, at the round of best mean val", main=True, protocol="held"),
        card("best round", str(final.get("best_round") or "–"),
             f"of {n}; val there {pct(final.get('val_at_best_val'))} %", protocol="held"),
        card("per-client best-val test (%)", pct(final.get("per_client_best_val_test")),
             "each client at its own best-val round, then the mean", protocol="held"),
    ]
    if math.isfinite(_num(final.get("pooled_test_at_best_val_loss"))):
        cards += [
            card("pooled test @ lowest val loss (%)", pct(final["pooled_test_at_best_val_loss"]),
                 f"FedSpray's protocol, round {final.get('pooled_best_round')}", protocol="pooled"),
            card("pooled minority / majority (%)",
                 f"{pct(final.get('pooled_minority_at_best_val_loss'))} / "
                 f"{pct(final.get('pooled_majority_at_best_val_loss'))}",
                 "same round; minority: label not the client's majority training class",
                 protocol="pooled"),
        ]
    sent, received = _num(final.get("total_bytes_sent")), _num(final.get("total_bytes_received"))
    cards += [
        card("MB sent / received", f"{sent / 1e6:.1f} / {received / 1e6:.1f}",
             "array bytes to and from clients, all rounds"),
        card("wall time (s)", f"{_num(results.get('wall_time_s')):.1f}",
             f"local training {_num(final.get('total_time_train_s')):.1f} s summed over clients"),
        card("failures / void rounds", f"{final.get('failures', 0)} / {final.get('void_rounds', 0)}",
             _failures_note(final.get("failures_by_client", {}))),
    ]
    dp = results.get("dp")
    if dp:
        keyed = {True: "keyed by the owners' secrets", False: "seeded by the run (research: "
                 "whoever knows the seed can remove it)", None: "no release yet"}[dp.get("noise_keyed")]
        cards.append(card(f"privacy: dp={dp['scope']}",
                          f"ε = {_num(dp['epsilon']):.3g} at δ = {_num(dp['delta']):g}",
                          f"σ = {_num(dp['noise_multiplier']):.4g}, C = {_num(dp['clip']):g}, "
                          f"{dp['releases']} releases, {dp.get('neighbours', 'add-remove')} "
                          f"neighbours; covers {dp['covers']}; noise {keyed}"))
    if results.get("stopped"):
        cards.append(card("stopped early", f"after round {n}", str(results["stopped"])))
    return f'<div class="cards">{"".join(cards)}</div>'


def _failures_note(by_client: dict[str, Any]) -> str:
    if not by_client:
        return "no client failed"
    return "by client: " + ", ".join(f"{c}: {n}" for c, n in by_client.items())


def client_rows(results: dict[str, Any]) -> list[list[str]]:
    """Per client: its subgraph, the device it trained on, its best-val round and figures
    there (a bar for the test figure), and how often it failed."""
    final = results.get("final", {})
    per_client = final.get("per_client", {})
    failed = final.get("failures_by_client", {})
    rows = []
    for cid, facts in results.get("clients", {}).items():
        pc = per_client.get(cid, {})
        test = _num(pc.get("test"))
        bar = (f'<span class=bar style="width:{max(0.0, min(100.0, test)):.0f}px"></span>'
               if math.isfinite(test) else "")
        rows.append([escape(str(cid)), *(escape(str(facts.get(k, "–"))) for k in (
            "num-nodes", "num-edges", "num-train", "num-val", "num-test", "device")),
            escape(str(pc.get("best_round", "–"))), pct(pc.get("val")), bar + pct(test),
            escape(str(failed.get(cid, 0)))])
    return rows


#: Most rows of the per-round events table (a run with a client down for 1,000 rounds).
MAX_EVENT_ROWS = 500


def event_rows(results: dict[str, Any]) -> list[list[str]]:
    """Per round and client, in one line: why its reply failed or was rejected, and what
    robust aggregation did to its update (clipped, left out, its count capped)."""
    rows = []
    for r in results.get("rounds", []):
        events = {c: [f"failed: {why}" if not why.startswith("rejected") else why]
                  for c, why in r.get("failures", {}).items()}
        rule = results.get("config", {}).get("robust", "none")
        for c, note in r.get("robust", {}).items():
            events.setdefault(c, []).append(
                f"{'server' if rule == 'none' else f'robust={rule}'}: {note}")
        rows += [[str(r["round"]), c, "; ".join(lines)]
                 for c, lines in sorted(events.items(), key=lambda kv: int(kv[0]))]
    if len(rows) > MAX_EVENT_ROWS:
        rows = rows[:MAX_EVENT_ROWS] + [["…", "", f"{len(rows) - MAX_EVENT_ROWS} more rows in "
                                                 f"results.json (rounds[].failures, .robust)"]]
    return rows


def resume_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per resume: by hand (``resume=true``) or ``fedgraph-run``'s restart of a
    run whose ServerApp died (``--restarts``)."""
    return [[str(r["after_round"]), str(r["at"]), f"{_num(r.get('elapsed_before_s')):.1f}"]
            for r in results.get("resumes", [])]


CLIENT_HEADER = ["client", "nodes", "edges", "train", "val", "test", "device", "best-val round",
                 "val (%)", "test (%)", "failures"]


def cost_rows(results: dict[str, Any]) -> list[list[str]]:
    """The run's totals, then each phase run once before round 1 (``precompute``)."""
    final = results.get("final", {})

    def s(key: str) -> str:
        v = _num(final.get(key))
        return f"{v:.3f}" if math.isfinite(v) else "–"

    rows = [["MB sent to clients", f"{_num(final.get('total_bytes_sent')) / 1e6:.3f}"],
            ["MB received from clients", f"{_num(final.get('total_bytes_received')) / 1e6:.3f}"],
            ["s in rounds", s("total_time_round_s")],
            ["s the server waited for replies", s("total_time_wait_s")],
            ["s of aggregation", s("total_time_aggregate_s")],
            ["s of local training (sum over clients)", s("total_time_train_s")]]
    for phase, pre in results.get("precompute", {}).items():
        mb = f"{_num(pre.get('bytes_sent')) / 1e6:.3f} / {_num(pre.get('bytes_received')) / 1e6:.3f}"
        rows.append([f"before round 1, phase {phase}: MB sent / received, s",
                     f"{mb}, {_num(pre.get('seconds')):.3f}"])
    return rows


def server_rows(results: dict[str, Any]) -> list[list[str]]:
    """The last round's server metrics (aggregate), e.g. FedAux's spectral gap."""
    rounds = [r for r in results.get("rounds", []) if r.get("aggregate")]
    if not rounds:
        return []
    last = rounds[-1]
    return [[k, f"{_num(v):.6g}", str(last["round"])] for k, v in sorted(last["aggregate"].items())]


def config_block(config: dict[str, Any]) -> str:
    """The resolved config: the common keys and this algorithm's (another algorithm's
    switches cannot change the run), values that differ from the default in bold."""
    from .config import all_defaults, common_defaults
    from .core.registry import get_algorithm

    defaults = all_defaults()
    try:
        own = set(common_defaults()) | set(get_algorithm(str(config.get("algorithm"))).config_defaults)
    except ValueError:  # an algorithm since removed: show everything
        own = set(config)
    lines = []
    for key, value in config.items():
        if key in defaults and key not in own:
            continue
        changed = key in defaults and json.dumps(value, default=str) != json.dumps(
            defaults[key], default=str)
        lines.append(f'<div{" class=changed" if changed else ""}><span class=k>{escape(key)}</span> = '
                     f"{escape(json.dumps(value, default=str))}</div>")
    return (f'<p class=muted>Common keys and {escape(str(config.get("algorithm")))}\'s own; '
            f'<b>bold</b>: not the default.</p><div class=cfg>{"".join(lines)}</div>')


def run_report_html(results: dict[str, Any], run_dir: Path) -> str:
    """The page for one run; figures come from ``run_dir`` (costs.png, heatmap_*.png)
    plus the per-round curves drawn here."""
    from .plots import run_curves_png

    config = results.get("config", {})
    title, sub = run_title(config, len(results.get("rounds", [])))
    parts = [f"<h1>{escape(title)}</h1><p class=sub>{escape(sub)}</p>", headline_cards(results)]
    if results.get("rounds"):
        parts.append("<h2>Per round</h2>" + figure(
            run_curves_png(results), "mean over all clients' held models per round; dotted: "
            "the best mean-val round"))
    parts.append("<h2>Per client</h2>" + table(CLIENT_HEADER, client_rows(results), raw=True))
    events = event_rows(results)
    if events:
        parts.append("<h2>Failed, rejected and screened replies</h2>"
                     + table(["round", "client", "what happened"], events, left=3))
    if results.get("resumes"):
        parts.append("<h2>Resumed from the checkpoint</h2>" + table(
            ["resumed after round", "at (UTC)", "s run before"], resume_rows(results), left=2))
    costs = _png(run_dir / "costs.png")
    parts.append("<h2>Costs</h2>" + table(["total", ""], cost_rows(results))
                 + (f"<div style='margin-top:10px'>{figure(costs, 'bytes and seconds per round')}"
                    "</div>" if costs else ""))
    heatmaps = sorted(run_dir.glob("heatmap_*.png"))
    server = server_rows(results)
    if heatmaps or server:
        parts.append("<h2>Server diagnostics</h2>")
        if server:
            parts.append(table(["server metric", "value", "round"], server) + "<br>")
        parts.append("<div class=pair>" + "".join(
            figure(p.read_bytes(), f"{p.stem.removeprefix('heatmap_')}: last round with data, "
                   "clients by partition id") for p in heatmaps) + "</div>")
    parts.append("<h2>Evaluation protocols</h2>" + protocols_block(run_dir))
    parts.append("<h2>Config</h2>" + data_root_line(results) + config_block(config))
    return page(f"{title} — {config.get('run-name')}", "".join(parts))


def data_root_line(results: dict[str, Any]) -> str:
    """The data root the run read (recorded by the server: ``data-root`` is often "" in
    the config, the root then coming from FEDGRAPH_DATA_ROOT or the default)."""
    used = results.get("data_root")
    if not isinstance(used, dict) or not used.get("path"):
        return ""
    return (f"<p>data root used: <code>{escape(str(used['path']))}</code> "
            f"<span class=muted>({escape(str(used.get('source', '')))}; as the server resolved it: "
            f"a simulation's clients share it, each SuperNode of a deployment resolves its own)"
            f"</span></p>")


def write_run_report(results: dict[str, Any], out: Path) -> Path:
    """``out/report.html`` for the run whose files are in ``out``."""
    return _write(Path(out) / "report.html", run_report_html(results, Path(out)))


# --- one grid ----------------------------------------------------------------------------
def run_link(out: Path, result: dict[str, Any]) -> str:
    """A link to a run's report.html (written now if the run predates reports), or its
    name alone where its folder is not under ``out``."""
    name = str(result["config"].get("run-name", ""))
    folder = out / name
    if not name or not (folder / "results.json").is_file():
        return escape(name or "?")
    if not (folder / "report.html").is_file():
        write_run_report(json.loads((folder / "results.json").read_text()), folder)
    return f'<a href="{escape(quote(name))}/report.html">{escape(name)}</a>'


def run_rows(out: Path, cells: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for cell, results in sorted(cells.items()):
        for res in sorted(results, key=lambda r: r["config"].get("seed", 0)):
            final = res["final"]
            rows.append([escape(cell), escape(str(res["config"].get("seed"))),
                         pct(final.get("test_at_best_val")), escape(str(final.get("best_round"))),
                         pct(final.get("per_client_best_val_test")),
                         f"{_num(res.get('wall_time_s')):.1f}",
                         f"{_num(final.get('total_bytes_sent')) / 1e6:.1f}",
                         escape(str(final.get("failures", 0))), run_link(out, res)])
    return rows


RUN_HEADER = ["cell", "seed", "test @ best val (%)", "best round", "per-client best-val test (%)",
              "wall s", "MB sent", "failures", "report"]
GRID_FIGURES = (("curves.png", "held mean test per round, mean ± 1 std over seeds"),
                ("per_client.png", "each client's best-val test, mean ± std over seeds"),
                ("minority.png", "FedSpray's pooled overall / majority / minority test"))


def grid_report_html(out: Path, name: str, header: list[str], rows: list[list[str]],
                     cells: dict[str, list[dict[str, Any]]], spec: dict[str, Any] | None) -> str:
    runs = sum(len(r) for r in cells.values())
    title = (f"<h1>grid {escape(name)}</h1><p class=sub>{len(cells)} cells · {runs} runs · "
             f"mean ± std over seeds · {escape(str(out))}</p>")
    parts = [title, "<h2>Cells</h2>" + table(header, rows, left=2)]
    figures = [(out / f, c) for f, c in GRID_FIGURES]
    figures += [(p, f"headline figure against {p.stem.removeprefix('by_')}")
                for p in sorted(out.glob("by_*.png"))]
    shown = [figure(p.read_bytes(), c) for p, c in figures if p.is_file()]
    if shown:
        parts.append("<h2>Figures</h2>" + "".join(shown))
    parts.append("<h2>Runs</h2>" + table(RUN_HEADER, run_rows(out, cells), left=2, raw=True))
    if spec:
        import yaml

        parts.append("<h2>Grid file</h2><pre class=cfg style='columns:1'>"
                     f"{escape(yaml.safe_dump(spec, sort_keys=False))}</pre>")
    return page(f"grid {name}", "".join(parts))


def write_grid_report(out: Path, header: list[str], rows: list[list[str]],
                      cells: dict[str, list[dict[str, Any]]], spec: dict[str, Any] | None) -> Path:
    """``out/report.html``: the grid's table (``header``/``rows`` as table.md has them),
    its figures, and every run with a link to its own report."""
    name = str((spec or {}).get("name") or out.name)
    return _write(out / "report.html", grid_report_html(out, name, header, rows, cells, spec))


__all__ = ["write_grid_report", "write_run_report"]
