"""``report.md``: the run's header (which model, which weights), the paper comparison, one
section per experiment with its stated choices, and the normalizers side by side.

Built from the results document only; a number in the report is a number in ``results.json``.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import median

from attnverify.atomic import write_text_atomic
from attnverify.empirical.config import PAPER_TABLE1_SECONDS
from attnverify.empirical.targets import MODEL_SOFTMAX

TITLES = {
    "distance_vs_length": "Algorithm 1 — distance vs length (Fig. 2a)",
    "distance_vs_topn": "Algorithm 2 — distance vs top-N (Fig. 2b)",
    "critical_topn": "Algorithm 3 — critical top-N (Fig. 2c)",
    "separability": "Algorithm 4 — geometric separability (Fig. 3)",
    "gradient": "Algorithm 5 — gradient sensitivity (Fig. 4)",
    "lemma1": "Lemma 1 on the model — max weight and entropy vs L",
    "temperature": "Temperature vs selectivity — N_s/N and d̃ vs T",
    "coverage": "Multi-head coverage, measured",
    "convergence": "N → L — actual vs expected distance, tightness of the bound",
    "rank_collapse": "Paper B — rank collapse at initialisation",
    "training": "Paper B — gradient histories during training",
}


def write_report(document: dict, path: Path) -> None:
    write_text_atomic(Path(path), render(document))


def render(document: dict) -> str:
    parts = [_header(document), _comparison(document), _embedding_variants(document)]
    for name, result in document["experiments"].items():
        parts.append(SECTIONS[name](result, document))
    if len(document.get("normalizers", [])) > 1:
        parts.append(_normalizers(document))
    return "\n\n".join(p for p in parts if p) + "\n"


def _f(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def _med(values) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return median(finite) if finite else float("nan")


def _se(values) -> float:
    x = [v for v in values or [] if v is not None and math.isfinite(v)]
    if len(x) < 2:
        return float("nan")
    mean = sum(x) / len(x)
    return math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1) / len(x))


def _pm(value, windows) -> str:
    """``value ± SE``: the standard error across windows of the per-window statistic."""
    se = _se(windows)
    return _f(value) if not math.isfinite(se) else f"{_f(value)} ± {_f(se, 2)}"


SE_NOTE = ("± is the standard error across text windows of the same statistic computed on "
           "each window alone.")


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---- header -----------------------------------------------------------------------------------


def _header(doc: dict) -> str:
    meta = doc.get("model")
    lines = ["# attnverify empirical — the papers' experiments on "
             + (f"`{meta['name']}`" if meta else "attention stacks")]
    if doc.get("command"):
        lines.append("Regenerate with (from the repository root):\n\n```\n" + doc["command"]
                     + "\n```")
    if meta:
        lines.append(_model_banner(meta))
    lines.append(_table(["", ""], _header_rows(doc)))
    return "\n\n".join(lines)


def _model_banner(meta: dict) -> str:
    if meta["pretrained"] and meta["weights"] != "pretrained":
        return (f"> **Model: `{meta['name']}` — weights {meta['weights']}.** "
                f"{meta['description']}. These are this model's numbers, not GPT-2's unless "
                "the directory holds GPT-2.")
    if meta["pretrained"]:
        note = ("These are this model's numbers. Paper A's experiments used GPT-2 (124M); "
                "nothing here is a GPT-2 result unless the model above is GPT-2 itself.")
        return f"> **Model: `{meta['name']}` — pretrained weights.** {meta['description']}. {note}"
    return (f"> **Model: `{meta['name']}` — random (seeded) weights.** {meta['description']}. "
            "Random attention carries no meaning: these numbers exercise the method and its "
            "cost. They are not GPT-2 results and say nothing about trained models.")


def _header_rows(doc: dict) -> list[list[str]]:
    meta, env, s = doc.get("model"), doc["environment"], doc["settings"]
    rows = []
    if meta:
        total = meta["layers"] * meta["heads_per_layer"]
        rows += [
            ["model", f"{meta['name']} — {meta['source']}"],
            ["weights", meta["weights"]],
            ["heads", f"{meta['layers']} layers × {meta['heads_per_layer']} query heads "
                      f"({meta['kv_heads_per_layer']} key/value heads per layer) = {total}, "
                      f"d_head = {meta['head_dim']}, {meta['parameters']:,} parameters"],
            ["tokens", f"{meta['windows']} window(s) × L_max = {meta['max_length']} tokens "
                       f"({meta['tokenizer']}); one forward pass per window"],
        ]
    if doc.get("text"):
        t = doc["text"]
        rows.append(["text", f"`{Path(t['path']).name}` (sha256 {t['sha256'][:12]}…), prose "
                             f"from line {t['first_line']}"])
    rows.append(["x_i (--embeddings)", EMBEDDING_WORDS.get(s.get("embeddings", "value"), "")
                 + (f"; also rerun with {', '.join(s['embedding_variants'])}"
                    if s.get("embedding_variants") else "")])
    rows.append(["settings", f"seed {s['seed']}, rows per length ≤ {s['rows_per_length']}, "
                             f"Monte-Carlo draws {s['mc_draws']} (Alg. 1–2), "
                             f"{s['critical_draws']} (Alg. 3)"])
    rows.append(["environment", f"torch {env['torch_version']}, transformers "
                                f"{env['transformers_version']}, {env['device']}, "
                                f"{env['cpu_threads']} thread(s), peak RSS of the last "
                                f"process {env['peak_rss_mb']:.0f} MB"])
    rows.append(["wall time", _timing(doc) + " (each step as timed when it ran)"])
    return rows


def _timing(doc: dict) -> str:
    meta = doc.get("model") or {}
    parts = [f"load {meta['seconds']['load']:.1f} s, forward {meta['seconds']['extract']:.1f} s"
             ] if meta else []
    for name, result in doc["experiments"].items():
        paper = PAPER_TABLE1_SECONDS.get(name)
        extra = f" (paper: {duration(paper)})" if paper else ""
        parts.append(f"{name} {result.get('seconds', float('nan')):.1f} s{extra}")
    return "; ".join(parts)


def duration(seconds: float) -> str:
    """``17 h 4 min``, ``37 min``, ``12.3 s``."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {round(seconds % 3600 / 60)} min"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.1f} s"


def _comparison(doc: dict) -> str:
    all_rows = doc.get("paper_comparison", [])
    if not all_rows:
        return ""
    stated = [r for r in all_rows if not r.get("diagnostic")]
    extra = [r for r in all_rows if r.get("diagnostic")]
    who = doc["model"]["name"] if doc.get("model") else "the stacks"
    agree = sum(1 for r in stated if r["agrees"])
    scored = sum(1 for r in stated if r["agrees"] is not None)
    parts = ["## Paper comparison\n\nMeasured on " + who + " with its own softmax attention, "
             "each claim scored on the quantity and the shape the paper states (the criterion "
             f"of each row is in `results.json`). **{agree} of {scored} scored claims agree.**",
             _table(["experiment", "claim", "paper says", "measured", "agrees"],
                    [[r["experiment"], r["claim"], r["paper"], r["measured"],
                      _agree(r["agrees"])] for r in stated])]
    if extra:
        parts += ["### Diagnostics (not claims of the papers; not counted)",
                  _table(["experiment", "check", "why it is apart", "measured", "holds"],
                         [[r["experiment"], r["claim"], r["paper"], r["measured"],
                           "yes" if r.get("holds") else "no"] for r in extra])]
    return "\n\n".join(parts)


EMBEDDING_WORDS = {
    "value": "value — the head's value vectors (what the weights average: s is the head's "
             "own output before W_O)",
    "hidden": "hidden — the layer's normalised input hidden states (shared by its heads)",
    "input": "input — the token embeddings (shared by every head)",
}


def _embedding_variants(doc: dict) -> str:
    """How the scored verdicts move when x_i is read differently."""
    variants = doc.get("embedding_variants") or {}
    if not variants:
        return ""
    main = doc["settings"].get("embeddings", "value")
    choices = [main, *variants]
    tables = {main: {(r["experiment"], r["claim"]): r for r in doc["paper_comparison"]}}
    for name, v in variants.items():
        tables[name] = {(r["experiment"], r["claim"]): r for r in v["paper_comparison"]}
    keys = [k for k in tables[main] if k[0] in {e for v in variants.values()
                                                 for e in v["experiments"]}
            and not tables[main][k].get("diagnostic")]
    rows = [[k[0], k[1]] + [_agree(tables[c][k]["agrees"]) if k in tables[c] else "–"
                            for c in choices] for k in keys]
    counts = ["", "**agreeing, of scored**"] + [
        f"{sum(1 for k in keys if k in tables[c] and tables[c][k]['agrees'])} of "
        f"{sum(1 for k in keys if k in tables[c] and tables[c][k]['agrees'] is not None)}"
        for c in choices]
    detail = [[k[0], k[1]] + [tables[c][k]["measured"] if k in tables[c] else "–"
                              for c in choices] for k in keys]
    return "\n\n".join([
        "## How the verdicts move with what x_i is (`--embeddings`)",
        "The experiments that depend on the embeddings, rerun with the model's own softmax for "
        "each choice (the main tables use the first). "
        + " ".join(EMBEDDING_WORDS[c] + "." for c in choices),
        _table(["experiment", "claim"] + choices, rows + [counts]),
        "<details><summary>Measured values per choice</summary>\n\n"
        + _table(["experiment", "claim"] + choices, detail) + "\n\n</details>",
    ])


def _agree(flag) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[flag]


def _choices(result: dict) -> str:
    return "Choices:\n\n" + "\n".join(f"- {c}" for c in result.get("choices", []))


def _figure(doc: dict, name: str) -> str:
    fig = doc.get("figures", {}).get(name)
    return f"![{TITLES.get(name, name)}]({fig})" if fig else ""


# ---- sections ---------------------------------------------------------------------------------


def _distance_vs_length(result: dict, doc: dict) -> str:
    own = result["normalizers"][MODEL_SOFTMAX]
    rows = []
    for i, length in enumerate(result["lengths"]):
        win = {k: (own.get(f"{k}_window_median") or [[]] * len(result["lengths"]))[i]
               for k in ("dtilde", "bound", "E_main", "E_mc")}
        rows.append([length, own["rows"][i], _pm(_med(own["dtilde"][i]), win["dtilde"]),
                     _pm(_med(own["bound"][i]), win["bound"]),
                     _pm(_med(own["E_main"][i]), win["E_main"]),
                     _pm(_med(own["E_mc"][i]), win["E_mc"]),
                     _f(_med(own["E_mc_se"][i]), 2),
                     _f(own["epsilon_over_E"][i]["median"]), own["bound_violations"][i]])
    head = ["L", "(head, token) rows", "d̃", "Thm 1.1 bound", "E main term", "E (MC)",
            "MC SE of E", "ε/E", "bound violations"]
    return "\n\n".join([f"## {TITLES['distance_vs_length']}",
                        f"N = {result['N']}; medians over heads of per-head means over tokens. "
                        + SE_NOTE,
                        _table(head, rows), _figure(doc, "distance_vs_length"),
                        _choices(result)])


def _distance_vs_topn(result: dict, doc: dict) -> str:
    own = result["normalizers"][MODEL_SOFTMAX]
    def cell(key, i):
        return _pm(_med(own[key][i]), own.get(f"{key}_window_median", [[]] * (i + 1))[i])

    rows = [[n, cell("dtilde", i), cell("bound", i), cell("E_main", i), cell("E_mc", i),
             own["bound_violations"][i]] for i, n in enumerate(result["N"])]
    head = ["N", "d̃", "Thm 1.1 bound", "E main term", "E (MC)", "bound violations"]
    return "\n\n".join([f"## {TITLES['distance_vs_topn']}",
                        f"L = {result['L']}, {result['rows']} tokens per head and window. "
                        + SE_NOTE,
                        _table(head, rows), _figure(doc, "distance_vs_topn"), _choices(result)])


def _critical(result: dict, doc: dict) -> str:
    own = result["normalizers"][MODEL_SOFTMAX]
    rows = []
    for entry, cap in zip(own["per_length"], result["N_max"]):
        c1, c5 = entry["critical"]["0.01"], entry["critical"]["0.05"]
        rows.append([entry["L"], cap, _f(c1) if c1 else f"> {cap}", _f(c5) if c5 else f"> {cap}",
                     _f(entry["critical_over_L"]["0.05"]), len(entry["N"])])
    fits = "; ".join(
        f"α = {a}: slope {_f(own['fit'][a]['slope'])} (R² {_f(own['fit'][a]['r2'])}, "
        f"{own['fit'][a]['points']} points)" for a in own["fit"])
    head = ["L", "N_max", "critical N (α=0.01)", "critical N (α=0.05)", "N/L (α=0.05)",
            "N evaluated"]
    return "\n\n".join([f"## {TITLES['critical_topn']}",
                        "The KS test pools the per-head means of every window (one test per "
                        "(L, N)), so this table has no per-window error bars; the second reading "
                        "of the verdict is in the comparison table.",
                        _table(head, rows),
                        f"Fitted critical N / L (paper: 0.06): {fits}.",
                        _figure(doc, "critical_topn"), _choices(result)])


def _separability(result: dict, doc: dict) -> str:
    own = result["normalizers"][MODEL_SOFTMAX]
    show = [i for i, n in enumerate(result["N"]) if n in (1, 2, 4, 8, 16, 24, 32, 48, 64)]
    win = own.get("ratio_window_median") or [[]] * len(result["N"])
    rows = [[result["N"][i], _pm(own["ratio_quantiles"][i]["median"], win[i]),
             f"{_f(own['ratio_quantiles'][i]['q25'])}–{_f(own['ratio_quantiles'][i]['q75'])}",
             _f(own["lower_quantiles"][i]["median"]), _f(own["upper_quantiles"][i]["median"]),
             _f(own["lower_violation_fraction"][i]), _f(own["upper_violation_fraction"][i])]
            for i in show]
    head = ["N", "N_s/N (median)", "IQR over heads", "lower bound", "upper bound",
            "lower violated (rows)", "upper violated (rows)"]
    d = result["delta"]
    geometry = (f"δ over heads: median {_f(d['median'])}, range {_f(d['min'])}–{_f(d['max'])}; "
                f"{result['rows_with_duplicates']} of {result['rows_total']} rows hold duplicate "
                "value vectors (left out of δ).")
    return "\n\n".join([f"## {TITLES['separability']}", SE_NOTE, _table(head, rows), geometry,
                        _figure(doc, "separability"), _heads(result, doc), _choices(result)])


def _heads(result: dict, doc: dict) -> str:
    own = result["normalizers"][MODEL_SOFTMAX]
    order = sorted(range(len(result["heads"])), key=lambda i: own["entropy_normalized"][i])
    k = min(5, len(order) // 2)
    pick = order[:k] + order[len(order) - k:]
    rows = [[result["heads"][i], _f(own["entropy_normalized"][i]), _f(own["plateau"][i]),
             "peaked" if j < k else "diffuse"] for j, i in enumerate(pick)]
    return "\n\n".join([
        "### Per-head diagnostic (saturated heads)",
        "The most peaked and the most diffuse heads (up to five each) by mean normalised entropy, "
        "with their "
        "N_s/N plateau. A diffuse head (entropy near 1) is in Lemma 1's vanishing-attention "
        "regime; the full per-head table is in `results.json`.",
        _table(["head", "entropy / log(keys)", "N_s/N plateau", "kind"], rows),
        _figure(doc, "head_diagnostics"),
    ])


def _gradient(result: dict, doc: dict) -> str:
    own = result["normalizers"][MODEL_SOFTMAX]
    ts = result["T"]
    show = range(0, len(ts), max(1, len(ts) // 8))
    head = ["T"] + [f"g (ε={e:g})" for e in result["eps"]] + ["1/(4T)", "1/(2T)", "argmax head"]
    win = own.get("g_window") or [[[]] * len(ts)] * len(result["eps"])
    rows = [[_f(ts[i])] + [_pm(own["g"][k][i], win[k][i]) for k in range(len(result["eps"]))]
            + [_f(1 / (4 * ts[i])), _f(1 / (2 * ts[i])), own["argmax_head"][0][i]] for i in show]
    v = own["violations"]
    note = (f"Worst token per (head, T, ε): {v['half_over_T']} above 1/(2T), "
            f"{v['sqrt2_over_eps']} above √2/ε, {v['quarter_over_T']} above 1/(4T), of "
            f"{v['checked']}.")
    return "\n\n".join([f"## {TITLES['gradient']}", SE_NOTE + " Per window, g is the "
                        "maximum over heads of that window's per-head means.",
                        _table(head, rows), note,
                        _figure(doc, "gradient"), _choices(result)])


def _lemma1(result: dict, doc: dict) -> str:
    rows = []
    for i, length in enumerate(result["lengths"]):
        rows.append([length, _pm(_med(result["max_weight"][i]),
                                 result["max_weight_window_median"][i]),
                     _f(length * _med(result["max_weight"][i])),
                     _pm(_med(result["entropy_normalized"][i]),
                         result["entropy_window_median"][i]),
                     _f(result["range_quantiles"][i]["median"]), result["violations"][i]])
    q = result["max_weight_slope_quantiles"]
    note = (f"Per-head slope of log(mean max weight) against log L: median {_f(q['median'])}, "
            f"IQR {_f(q['q25'])}…{_f(q['q75'])}, range {_f(q['min'])}…{_f(q['max'])}; "
            f"{result['vanishing_heads']} of {len(result['heads'])} heads at or below −0.5.")
    head = ["L", "max weight (median head)", "L × max weight", "entropy / log(keys)",
            "logit range ρ (median head)", "Cor. 1 violations"]
    return "\n\n".join([f"## {TITLES['lemma1']}", SE_NOTE, _table(head, rows), note,
                        _figure(doc, "lemma1"), _choices(result)])


def _temperature(result: dict, doc: dict) -> str:
    rows = []
    for i, t in enumerate(result["T"]):
        rows.append([_f(t)] + [_pm(result["ratio_quantiles"][i][k]["median"],
                                   result["ratio_window_median"][i][k])
                               for k in range(len(result["N"]))]
                    + [_pm(_med(result["dtilde"][i]), result["dtilde_window_median"][i])])
    head = ["T"] + [f"N_s/N (N={n})" for n in result["N"]] + [f"d̃ (N={result['topn']})"]
    return "\n\n".join([f"## {TITLES['temperature']}",
                        f"L = {result['L']}; medians over heads. " + SE_NOTE,
                        _table(head, rows), _figure(doc, "temperature"), _choices(result)])


def _coverage(result: dict, doc: dict) -> str:
    rows = [[layer, _f(result["best_head"][layer]), _f(result["measured"][layer]),
             _f(result["independent"][layer]), _f(result["formula"][layer]),
             _f(result["union_over_n"][layer])] for layer in range(result["layers"])]
    head = ["layer", "best head N_s/N", "coverage |∪S|/|∪I|", "independence prediction",
            "1 − (1−p̄)^H", "|∪I| / N"]
    note = ("Median over layers of the measured coverage per window: "
            f"{_pm(_med(result['measured']), result['measured_window_median'])}. " + SE_NOTE)
    return "\n\n".join([f"## {TITLES['coverage']}",
                        f"L = {result['L']}, N = {result['N']}, {result['heads_per_layer']} "
                        "query heads per layer; means over windows and rows.",
                        _table(head, rows), note, _figure(doc, "coverage"), _choices(result)])


def _convergence(result: dict, doc: dict) -> str:
    def cell(key, i):
        return _pm(_med(result[key][i]), result.get(f"{key}_window_median", [[]] * (i + 1))[i])

    rows = [[n, cell("dtilde", i), cell("E_mc", i), cell("bound", i),
             _f(result["gap_quantiles"][i]["median"]),
             _f(result["tightness_quantiles"][i]["median"])]
            for i, n in enumerate(result["N"])]
    head = ["N", "d̃", "E (MC)", "Thm 1.1 bound", "|d̃ − E| / max", "d̃ / bound"]
    return "\n\n".join([f"## {TITLES['convergence']}",
                        f"L = {result['L']}, the row with exactly L keys in each of "
                        f"{result['windows']} windows; medians over heads. " + SE_NOTE,
                        _table(head, rows), _figure(doc, "convergence"), _choices(result)])


def _collapse(result: dict, doc: dict) -> str:
    blocks = [f"## {TITLES['rank_collapse']}"]
    for arch, kinds in result["architectures"].items():
        depth = len(next(iter(kinds.values()))["residual"]) - 1
        show = sorted({0, 1, 2, 4, 8, depth} & set(range(depth + 1)))
        head = (["stack"] + [f"layer {i}" for i in show]
                + ["‖∇W_Q‖ layer 1", "weakest layer's ‖∇W_Q‖", "output rms"])
        rows = [[name] + [_f(data["residual"][i]) for i in show]
                + [_f(data["grad_q"][0]), _f(min(data["grad_q"])), _f(data["rms"][-1])]
                for name, data in kinds.items()]
        blocks.append(f"‖res(X)‖_F/‖X‖_F per layer, {arch} stack (median over "
                      f"{result['seeds']} seeds):\n\n" + _table(head, rows))
    blocks += [_figure(doc, "rank_collapse"), _choices(result)]
    return "\n\n".join(blocks)


def _training(result: dict, doc: dict) -> str:
    rows = []
    for name, h in result["kinds"].items():
        first, last = h["grad_q"][0], h["grad_q"][-1]
        rows.append([name, _f(h["lambda_pos"]), _f(h["lambda_neg"]), _f(h["loss"][0]),
                     _f(h["loss"][-1]), " / ".join(_f(v) for v in first),
                     " / ".join(_f(v) for v in last),
                     _f(_med([min(layer) for layer in h["grad_q"]]))])
    head = ["attention", "λ⁺", "λ⁻", "loss (step 0)", f"loss (step {result['steps'] - 1})",
            "‖∇W_Q‖ per layer, step 0", "‖∇W_Q‖ per layer, last step",
            "median over steps of the weakest layer"]
    return "\n\n".join([f"## {TITLES['training']}", _table(head, rows),
                        _figure(doc, "training"), _choices(result)])


def _normalizers(doc: dict) -> str:
    ex = doc["experiments"]
    rows = [[n["id"], n["space"]] + _normalizer_cells(ex, n["id"]) for n in doc["normalizers"]]
    head = ["normalizer", "space", "d̃ (N=5, L_max)", "Thm 1.1 violations", "E (MC)",
            "N_s/N plateau", "Thm 2 lower violated", "g(T≈0.01)", "g(T=1)",
            "> 1/(2T) (softmax's bound)"]
    text = ("Each normalizer is applied to the model's own logits (the model's forward pass is "
            "unchanged: these are the weights the normalizer *would* give). Theorem 1.1 and the "
            "Theorem 2 lower bound are theorems for simplex weights only, and 1/(2T) is "
            "softmax's own bound (sparsemax's Jacobian reaches 1/T); a violation by another "
            "normalizer is expected, not a bug.")
    return "\n\n".join(["## Normalizers side by side", text, _table(head, rows),
                        _figure(doc, "normalizers")])


def _normalizer_cells(ex: dict, nid: str) -> list[str]:
    cells = ["–"] * 8
    if "distance_vs_length" in ex:
        own = ex["distance_vs_length"]["normalizers"][nid]
        cells[0] = _f(_med(own["dtilde"][-1]))
        cells[1] = str(sum(own["bound_violations"]))
        cells[2] = _f(_med(own["E_mc"][-1]))
    if "separability" in ex:
        own = ex["separability"]["normalizers"][nid]
        cells[3] = _f(_med(own["plateau"]))
        cells[4] = _f(max(own["lower_violation_fraction"]))
    if "gradient" in ex:
        res = ex["gradient"]
        own = res["normalizers"][nid]
        near = min(range(len(res["T"])), key=lambda i: abs(math.log(res["T"][i] / 0.01)))
        one = min(range(len(res["T"])), key=lambda i: abs(math.log(res["T"][i])))
        cells[5], cells[6] = _f(own["g"][0][near]), _f(own["g"][0][one])
        cells[7] = str(own["violations"]["half_over_T"])
    return cells


SECTIONS = {
    "distance_vs_length": _distance_vs_length,
    "distance_vs_topn": _distance_vs_topn,
    "critical_topn": _critical,
    "separability": _separability,
    "gradient": _gradient,
    "lemma1": _lemma1,
    "temperature": _temperature,
    "coverage": _coverage,
    "convergence": _convergence,
    "rank_collapse": _collapse,
    "training": _training,
}
