"""The ``paper_comparison`` table: what each paper says, what this run measured, whether they agree.

Rows are built from the results only (never re-derived from the model). Each row names its
criterion, so "agrees" can be checked by a reader. Numbers are those of the model's own softmax
attention; they are the checked model's numbers, never GPT-2's unless the model is GPT-2.
"""

from __future__ import annotations

import math
from statistics import median

from attnverify.empirical.targets import MODEL_SOFTMAX


def paper_comparison(document: dict) -> list[dict]:
    ex = document.get("experiments", {})
    rows = []
    for name, builders in BUILDERS.items():
        if name not in ex:
            continue
        for build in builders:
            built = build(ex[name])
            for row in built if isinstance(built, list) else [built]:
                rows.append({"experiment": name, **row})
    return rows


def _row(claim: str, paper: str, measured: str, agrees: bool | None, criterion: str) -> dict:
    return {"claim": claim, "paper": paper, "measured": measured,
            "agrees": None if agrees is None else bool(agrees), "criterion": criterion}


def _own(result: dict) -> dict:
    return result["normalizers"][MODEL_SOFTMAX]


def _med(values) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return median(finite) if finite else float("nan")


def _fmt(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3g}"


# ---- Algorithm 1 ------------------------------------------------------------------------------


def thm11_holds(result: dict) -> dict:
    own = _own(result)
    bad = sum(own["bound_violations"])
    total = sum(own["rows"])
    worst = max(own["worst_bound_ratio"])
    return _row(
        "Theorem 1.1: d̃ ≤ (1−ᾱ_N)·d_1 + max‖x_j‖·[ᾱ_N(L−N) − (1−ᾱ_N)] (fixed top-N set)",
        "holds for every row (simplex weights)",
        f"{bad} violations in {total} rows (N={result['N']}, all L); worst d̃/bound = "
        f"{_fmt(worst)}",
        bad == 0, "no row exceeds the bound beyond float tolerance",
    )


def epsilon_nonnegative(result: dict) -> dict:
    own = _own(result)
    bad = sum(own["epsilon_negative_heads"])
    heads = len(own["E_mc"][0]) * len(result["lengths"])
    return _row(
        "Theorem 1.2: E = main term + ε with ε ≥ 0 (random N-subset)",
        "ε ≥ 0 (Jensen)",
        f"per-head mean of E (Monte-Carlo) below the main term by more than 3 SE in {bad} of "
        f"{heads} (head, L) pairs",
        bad == 0, "no head with mean ε < −3·SE",
    )


def epsilon_small(result: dict) -> dict:
    own = _own(result)
    ratio = own["epsilon_over_E"][-1]["median"]
    return _row(
        "Theorem 1.2: ε is small",
        "E ≈ main term",
        f"median over heads of ε/E = {_fmt(ratio)} at L={result['lengths'][-1]}, "
        f"N={result['N']}",
        ratio < 0.1 if math.isfinite(ratio) else None, "ε/E < 0.1 ('small' read as under 10%)",
    )


def e_linear_in_length(result: dict) -> dict:
    own = _own(result)
    lengths = result["lengths"]
    meds = [_med(v) for v in own["E_mc"]]
    slope = _loglog_slope(lengths, meds)
    return _row(
        "Corollary 2: for fixed N ≪ L, E grows about linearly in L (Fig. 2a)",
        "E ∝ L",
        f"log-log slope of the median E over L = {lengths[0]}…{lengths[-1]}: {_fmt(slope)} "
        f"(E from {_fmt(meds[0])} to {_fmt(meds[-1])})",
        0.8 <= slope <= 1.2 if math.isfinite(slope) else None, "slope in [0.8, 1.2]",
    )


def _loglog_slope(xs, ys) -> float:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y and y > 0 and math.isfinite(y)]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    num = sum((p[0] - mx) * (p[1] - my) for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return num / den if den else float("nan")


# ---- Algorithm 2 ------------------------------------------------------------------------------


def distance_falls_with_n(result: dict) -> dict:
    own = _own(result)
    ns = result["N"]
    first, last = _med(own["dtilde"][0]), _med(own["dtilde"][-1])
    return _row(
        "Corollary 2 / Fig. 2b: for fixed L, d̃ and E shrink as N grows (→ 0 as N → L)",
        "d̃ decreases with N",
        f"median d̃ at L={result['L']}: {_fmt(first)} (N={ns[0]}) → {_fmt(last)} (N={ns[-1]}); "
        f"median E: {_fmt(_med(own['E_mc'][0]))} → {_fmt(_med(own['E_mc'][-1]))}",
        last < first if math.isfinite(first) and math.isfinite(last) else None,
        "median d̃ at the largest N below that at the smallest N",
    )


def thm11_holds_topn(result: dict) -> dict:
    own = _own(result)
    bad = sum(own["bound_violations"])
    return _row(
        "Theorem 1.1 at L = L_max for every N of Alg. 2",
        "holds",
        f"{bad} violations in {own['rows'] * len(result['N'])} (row, N) pairs",
        bad == 0, "no violation beyond float tolerance",
    )


# ---- Algorithm 3 ------------------------------------------------------------------------------


def six_percent_rule(result: dict) -> list[dict]:
    own = _own(result)
    rows = []
    for alpha in result["alphas"]:
        fit = own["fit"][str(alpha)]
        slope = fit["slope"]
        found = [e["critical"][str(alpha)] for e in own["per_length"]]
        measured = (
            f"critical N/L slope = {_fmt(slope)} (R² {_fmt(fit['r2'])}, {fit['points']} of "
            f"{len(found)} lengths); critical N per L: {found}"
            if slope is not None else
            f"the KS test still rejects at N_max = {result['N_max']} for every L (censored)"
        )
        rows.append(_row(
            f"Alg. 3: critical top-N ≈ 6% of L (KS α = {alpha})",
            "critical N / L ≈ 0.06", measured,
            0.03 <= slope <= 0.12 if slope is not None else False,
            "fitted slope within a factor 2 of 0.06",
        ))
    return rows


# ---- Algorithm 4 ------------------------------------------------------------------------------


def plateau_level(result: dict) -> dict:
    own = _own(result)
    level = _plateau(result)
    return _row(
        "Fig. 3: N_s/N falls until N ≈ 16, then saturates at 0.70–0.85",
        "plateau 0.70–0.85 (one head separates at most ~80%)",
        f"median over heads of N_s/N, averaged over N ≥ 16: {_fmt(level)}; at N=1: "
        f"{_fmt(own['ratio_quantiles'][0]['median'])}",
        0.70 <= level <= 0.85 if math.isfinite(level) else None, "plateau in [0.70, 0.85]",
    )


def _plateau(result: dict) -> float:
    own = _own(result)
    meds = [q["median"] for n, q in zip(result["N"], own["ratio_quantiles"]) if n >= 16]
    return sum(meds) / len(meds) if meds else float("nan")


def coverage_claim(result: dict) -> dict:
    p = _plateau(result)
    cover = 1 - (1 - p) ** 3 if math.isfinite(p) else float("nan")
    return _row(
        "Multi-head coverage: H independent heads separating p each cover 1 − (1−p)^H",
        "p = 0.8, H = 3 → 99.2%",
        f"with the measured plateau p = {_fmt(p)}: H = 3 → {_fmt(100 * cover)}%",
        cover >= 0.99 if math.isfinite(cover) else None, "coverage ≥ 99% with H = 3",
    )


def thm2_lower(result: dict) -> dict:
    own = _own(result)
    worst = max(own["lower_violation_fraction"])
    return _row(
        "Theorem 2 lower bound: 1 − Σξ_i/(rN) ≤ N_s/N",
        "holds", f"largest fraction of violating rows over N: {_fmt(worst)}",
        worst == 0, "no violating row",
    )


def thm2_upper(result: dict) -> list[dict]:
    own = _own(result)
    fractions = own["upper_violation_fraction"]
    avg = sum(own["upper_violated_on_average"])
    rest = [(f, n) for f, n in zip(fractions, result["N"]) if n >= 2]
    worst, where = max(rest) if rest else (float("nan"), None)
    return [
        _row("Theorem 2 upper bound, per instance: N_s/N ≤ (1/N)Σ exp(−(r−ξ_i)²/(16M²))",
             "holds", f"fraction of violating rows: {_fmt(fractions[0])} at N=1 (a separable "
             f"top token always exceeds exp(−r²/16M²) < 1), worst over N ≥ 2: {_fmt(worst)} "
             f"(N={where})",
             max(fractions) == 0, "no violating row"),
        _row("Theorem 2 upper bound on average (per-head means over tokens)",
             "holds (as E[N_s]/N)",
             f"{avg} (head, N) pairs of {len(own['ratio'][0]) * len(result['N'])} violate",
             avg == 0, "no head's mean N_s/N above its mean bound"),
    ]


# ---- Algorithm 5 ------------------------------------------------------------------------------


def _g_at(result: dict, temperature: float, eps_index: int = 0) -> float:
    ts = result["T"]
    i = min(range(len(ts)), key=lambda k: abs(math.log(ts[k] / temperature)))
    return _own(result)["g"][eps_index][i]


def gradient_bounds(result: dict) -> list[dict]:
    v = _own(result)["violations"]
    return [
        _row("softmax: g(T, ε) ≤ min{1/(2T), √2/ε} (mean value theorem)", "holds [derived]",
             f"worst token per (head, T, ε): {v['half_over_T']} above 1/(2T), "
             f"{v['sqrt2_over_eps']} above √2/ε, of {v['checked']}",
             v["half_over_T"] == 0 and v["sqrt2_over_eps"] == 0, "no token above either bound"),
        _row("Corollary 3 as stated: ‖∇_l α‖₂ ≤ min{1/(4T), √2}",
             "holds (THEORY §5: false for the spectral norm)",
             f"{v['quarter_over_T']} of {v['checked']} worst tokens above 1/(4T) (random "
             "directions rarely reach the two-way-tie witness)",
             v["quarter_over_T"] == 0, "no token above 1/(4T)"),
    ]


def inverse_t_trend(result: dict) -> dict:
    ts, g = result["T"], _own(result)["g"][0]
    pts = [(t, y) for t, y in zip(ts, g) if t < 0.1]
    slope = _loglog_slope([p[0] for p in pts], [p[1] for p in pts])
    return _row(
        "Fig. 4: for T < 0.1, g follows the 1/T trend",
        "log-log slope ≈ −1", f"slope of log g vs log T for T < 0.1 (ε = {result['eps'][0]}): "
        f"{_fmt(slope)}",
        -1.2 <= slope <= -0.8 if math.isfinite(slope) else None, "slope in [−1.2, −0.8]",
    )


def high_t_drop(result: dict) -> dict:
    drop = _g_at(result, 0.1) / _g_at(result, 1.0)
    return _row(
        "Fig. 4: for T ≥ 1, g drops by about two orders of magnitude",
        "≈ 100× lower", f"g(T=0.1) / g(T=1) = {_fmt(drop)} (ε = {result['eps'][0]})",
        30 <= drop <= 300 if math.isfinite(drop) else None, "ratio in [30, 300]",
    )


# ---- paper B ----------------------------------------------------------------------------------


def collapse_softmax(result: dict) -> dict:
    pure = result["architectures"]["pure"]["softmax"]["residual"]
    return _row(
        "Paper B / Dong et al.: a deep pure softmax stack collapses to rank 1 at initialisation",
        "‖res(X)‖/‖X‖ → 0 with depth",
        f"pure stack: {_fmt(pure[0])} (input) → {_fmt(pure[1])} (layer 1) → "
        f"{_fmt(pure[-1])} (layer {len(pure) - 1})",
        pure[-1] < 1e-3, "final ratio below 1e-3",
    )


def collapse_dagpam(result: dict) -> list[dict]:
    rows = []
    for arch in ("pure", "residual"):
        kinds = result["architectures"][arch]
        soft = kinds["softmax"]["residual"]
        layer = 1 if arch == "pure" else len(soft) - 1
        parts, slower = [], True
        for name, data in kinds.items():
            if name != "softmax":
                parts.append(f"λ={data['lambda']:g}: {_fmt(data['residual'][layer])}")
                slower &= data["residual"][layer] > soft[layer]
        rows.append(_row(
            f"Paper B: daGPAM collapses more slowly than softmax ({arch} stack)",
            "daGPAM keeps a larger residual",
            f"‖res‖/‖X‖ at layer {layer}: softmax {_fmt(soft[layer])}; " + ", ".join(parts),
            slower, "every λ above softmax at that layer",
        ))
    return rows


def dagpam_gradients(result: dict) -> dict:
    kinds = result["architectures"]["residual"]
    soft = kinds["softmax"]
    others = [(d["lambda"], d) for n, d in kinds.items() if n != "softmax"]
    parts = [f"λ={lam:g}: {_fmt(min(d['grad_q']))} (output rms {_fmt(d['rms'][-1])})"
             for lam, d in others]
    larger = all(min(d["grad_q"]) > min(soft["grad_q"]) for _, d in others)
    return _row(
        "Paper B: daGPAM eases gradient vanishing (query-weight gradients at initialisation)",
        "larger gradients than softmax",
        f"smallest per-layer ‖∂loss/∂W_Q‖ in the residual stack: softmax "
        f"{_fmt(min(soft['grad_q']))} (output rms {_fmt(soft['rms'][-1])}); " + ", ".join(parts),
        larger, "every λ's weakest layer above softmax's weakest layer",
    )


BUILDERS = {
    "distance_vs_length": [thm11_holds, epsilon_nonnegative, epsilon_small, e_linear_in_length],
    "distance_vs_topn": [distance_falls_with_n, thm11_holds_topn],
    "critical_topn": [six_percent_rule],
    "separability": [plateau_level, coverage_claim, thm2_lower, thm2_upper],
    "gradient": [gradient_bounds, inverse_t_trend, high_t_drop],
    "rank_collapse": [collapse_softmax, collapse_dagpam, dagpam_gradients],
}
