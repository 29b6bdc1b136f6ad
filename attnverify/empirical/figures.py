"""PNG figures mirroring paper A's Fig. 2a, 2b, 2c, 3, 4 and paper B's rank-collapse figure.

Every figure is drawn from ``results.json`` content only, names the model and its weights in
the title, labels both axes and uses log scales where the paper does. Medians over heads are
lines; the shaded band is the inter-quartile range over heads.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from attnverify.atomic import write_bytes_atomic
from attnverify.empirical.targets import MODEL_SOFTMAX

FIGURES = {
    "distance_vs_length": "fig2a_distance_vs_length.png",
    "distance_vs_topn": "fig2b_distance_vs_topn.png",
    "critical_topn": "fig2c_critical_topn.png",
    "separability": "fig3_separability.png",
    "gradient": "fig4_gradient.png",
    "lemma1": "lemma1_vanishing.png",
    "temperature": "temperature_selectivity.png",
    "coverage": "multihead_coverage.png",
    "convergence": "convergence_n_to_l.png",
    "rank_collapse": "figB_rank_collapse.png",
    "training": "figB_gradient_history.png",
}
EXTRA = {"heads": "head_diagnostics.png", "normalizers": "normalizers.png"}


def write_figures(document: dict, out: Path) -> dict[str, str]:
    """Draw every figure the results allow; returns ``{figure: file name}``."""
    try:
        import matplotlib  # optional dependency (plots extra)

        matplotlib.use("Agg")
    except ImportError:
        return {}
    ex = document["experiments"]
    title = _title(document)
    written = {}
    for name, filename in FIGURES.items():
        if name in ex:
            _save(DRAW[name](ex[name], title), Path(out) / filename)
            written[name] = filename
    if "separability" in ex:
        _save(head_diagnostics(ex["separability"], title), Path(out) / EXTRA["heads"])
        written["head_diagnostics"] = EXTRA["heads"]
    if len(document.get("normalizers", [])) > 1 and _has_any(ex):
        _save(normalizers_figure(ex, title), Path(out) / EXTRA["normalizers"])
        written["normalizers"] = EXTRA["normalizers"]
    return written


def _has_any(ex: dict) -> bool:
    return any(k in ex for k in ("distance_vs_length", "separability", "gradient"))


def _title(document: dict) -> str:
    meta = document.get("model")
    if not meta:
        return "attention stacks at initialisation"
    return f"{meta['name']} ({meta['weights']} weights)"


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())


def _quartiles(per_head_lists):
    """Median, q25, q75 over heads for each entry of a ``[x][head]`` list."""

    arr = np.array([[v if v is not None else np.nan for v in row] for row in per_head_lists],
                   dtype=float)
    return (np.nanmedian(arr, 1), np.nanpercentile(arr, 25, 1), np.nanpercentile(arr, 75, 1))


def _band(ax, x, lists, label, color, style="-"):
    med, lo, hi = _quartiles(lists)
    ax.plot(x, med, style, color=color, marker="o", ms=3, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.15)


def _band_quantiles(ax, x, quants, label, color, style="-"):
    """Like :func:`_band`, from stored ``quantiles`` dicts instead of per-head lists."""
    def get(key):
        return [math.nan if q[key] is None else q[key] for q in quants]

    ax.plot(x, get("median"), style, color=color, marker="o", ms=3, label=label)
    ax.fill_between(x, get("q25"), get("q75"), color=color, alpha=0.15)


def _theorem1(ax, x, own):
    _band(ax, x, own["dtilde"], "d̃ (top-N)", "C0")
    _band(ax, x, own["bound"], "Theorem 1.1 bound", "C3", "--")
    _band(ax, x, own["E_mc"], "E (random N-subset, MC)", "C2")
    _band(ax, x, own["E_main"], "Theorem 1.2 main term", "C1", ":")
    ax.set_yscale("log")
    ax.set_ylabel("distance (mean over tokens; median and IQR over heads)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def fig_distance_vs_length(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    _theorem1(ax, result["lengths"], result["normalizers"][MODEL_SOFTMAX])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("L (keys per query row)")
    ax.set_title(f"Fig. 2a analogue: distance vs length, N = {result['N']}\n{title}", fontsize=10)
    return fig


def fig_distance_vs_topn(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    _theorem1(ax, result["N"], result["normalizers"][MODEL_SOFTMAX])
    ax.set_xscale("log")
    ax.set_xlabel("N (selected tokens)")
    ax.set_title(f"Fig. 2b analogue: distance vs top-N, L = {result['L']}\n{title}", fontsize=10)
    return fig


def fig_critical(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    own = result["normalizers"][MODEL_SOFTMAX]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, entry in enumerate(own["per_length"]):
        ps = [max(p, 1e-300) for p in entry["p_value"]]
        left.plot([n / entry["L"] for n in entry["N"]], ps, marker=".", color=f"C{i}",
                  label=f"L = {entry['L']}")
    for alpha in result["alphas"]:
        left.axhline(alpha, color="k", ls=":", lw=0.8)
    left.set(xscale="log", yscale="log", xlabel="N / L", ylabel="KS p-value (d̃ vs E over heads)")
    left.legend(fontsize=7)
    left.grid(True, which="both", alpha=0.3)
    _critical_right(right, result, own)
    fig.suptitle(f"Fig. 2c analogue: critical top-N\n{title}", fontsize=10)
    return fig


def _critical_right(ax, result, own):
    lengths = result["lengths"]
    for i, alpha in enumerate(result["alphas"]):
        found = [(e["L"], e["critical"][str(alpha)]) for e in own["per_length"]
                 if e["critical"][str(alpha)]]
        if found:
            ax.plot(*zip(*found), "o", color=f"C{i}", label=f"critical N, α = {alpha}")
        slope = own["fit"][str(alpha)]["slope"]
        if slope:
            ax.plot(lengths, [slope * L for L in lengths], "-", color=f"C{i}",
                    label=f"fit: {100 * slope:.1f}% of L")
    if not any(own["fit"][str(a)]["slope"] for a in result["alphas"]):
        ax.text(0.05, 0.92, "no critical N below N_max at any L (censored)",
                transform=ax.transAxes, fontsize=8)
    ax.plot(lengths, [0.06 * L for L in lengths], "k--", label="paper: 6% of L")
    ax.plot(lengths, result["N_max"], "k:", label="N_max scanned")
    ax.set(xscale="log", yscale="log", xlabel="L", ylabel="critical N")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)


def fig_separability(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    own = result["normalizers"][MODEL_SOFTMAX]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ns = result["N"]
    _band(ax, ns, own["ratio"], "N_s/N", "C0")
    _band_quantiles(ax, ns, own["lower_quantiles"], "Theorem 2 lower bound", "C3", "--")
    _band_quantiles(ax, ns, own["upper_quantiles"], "Theorem 2 upper bound", "C1", ":")
    ax.axhspan(0.70, 0.85, color="grey", alpha=0.15, label="paper: plateau 0.70–0.85")
    ax.set(xscale="log", xlabel="N (selected tokens)", ylim=(-0.05, 1.05),
           ylabel="fraction separable (median, IQR over heads)")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Fig. 3 analogue: geometric separability, L = {result['L']}\n{title}",
                 fontsize=10)
    return fig


def fig_gradient(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    own = result["normalizers"][MODEL_SOFTMAX]
    ts = result["T"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, eps in enumerate(result["eps"]):
        ax.plot(ts, own["g"][i], marker="o", ms=3, color=f"C{i}", label=f"g(T, ε={eps:g})")
        ax.axhline(2**0.5 / eps, color=f"C{i}", ls=":", lw=0.8)
    ax.plot(ts, [1 / (4 * t) for t in ts], "k--", lw=0.8, label="1/(4T) (paper's Cor. 3)")
    ax.plot(ts, [1 / (2 * t) for t in ts], "k-.", lw=0.8, label="1/(2T) (spectral bound)")
    ax.plot([], [], "k:", lw=0.8, label="√2/ε")
    ax.set(xscale="log", yscale="log", xlabel="temperature T",
           ylabel="g = max over heads of mean δ_t")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Fig. 4 analogue: gradient sensitivity, L = {result['L']}\n{title}",
                 fontsize=10)
    return fig


def fig_lemma1(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    lengths = result["lengths"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _band(left, lengths, result["max_weight"], "max weight (median, IQR over heads)", "C0")
    med, _, _ = _quartiles(result["max_weight"])
    left.plot(lengths, [med[0] * lengths[0] / L for L in lengths], "k--", lw=0.8,
              label="1/L from the first point")
    left.set(xscale="log", yscale="log", xlabel="L (keys)", ylabel="mean max weight per head")
    _band(right, lengths, result["entropy_normalized"], "entropy / log(keys)", "C2")
    right.set(xscale="log", xlabel="L (keys)", ylabel="normalised entropy", ylim=(-0.02, 1.02))
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Lemma 1 on the model: does attention vanish with L?\n{title}", fontsize=10)
    return fig


def fig_temperature(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    ts = result["T"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, n in enumerate(result["N"]):
        _band_quantiles(left, ts, [q[k] for q in result["ratio_quantiles"]], f"N_s/N, N = {n}",
                        f"C{k}")
    left.set(xscale="log", xlabel="temperature T", ylabel="N_s/N (median, IQR over heads)",
             ylim=(-0.05, 1.05))
    _band(right, ts, result["dtilde"], f"d̃, N = {result['topn']}", "C3")
    right.set(xscale="log", yscale="log", xlabel="temperature T", ylabel="d̃ (median over heads)")
    for ax in (left, right):
        ax.axvline(1.0, color="k", ls=":", lw=0.8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Temperature vs selectivity, L = {result['L']}\n{title}", fontsize=10)
    return fig


def fig_coverage(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    layers = list(range(result["layers"]))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(layers, result["measured"], "o-", color="C0", label="measured |∪S_h| / |∪I_h|")
    ax.plot(layers, result["independent"], "s--", color="C1", label="independent heads")
    ax.plot(layers, result["formula"], ":", color="C2", label="1 − (1 − p̄)^H")
    ax.plot(layers, result["best_head"], "^-", color="C3", label="best single head N_s/N")
    ax.set(xlabel="layer", ylabel="fraction of selected tokens separated", ylim=(-0.05, 1.05))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Multi-head coverage, L = {result['L']}, N = {result['N']}, "
                 f"H = {result['heads_per_layer']}\n{title}", fontsize=10)
    return fig


def fig_convergence(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    ns = result["N"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _band(left, ns, result["dtilde"], "d̃ (top-N)", "C0")
    _band(left, ns, result["E_mc"], "E (random N-subset)", "C2")
    _band(left, ns, result["bound"], "Theorem 1.1 bound", "C3", "--")
    left.set(xscale="log", yscale="log", xlabel="N", ylabel="distance (median, IQR over heads)")
    _band_quantiles(right, ns, result["gap_quantiles"], "|d̃ − E| / max(d̃, E)", "C1")
    _band_quantiles(right, ns, result["tightness_quantiles"], "d̃ / bound", "C4")
    right.set(xscale="log", xlabel="N", ylabel="ratio", ylim=(-0.05, 1.05))
    for ax in (left, right):
        ax.axvline(100, color="k", ls=":", lw=0.8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"N → L at L = {result['L']}\n{title}", fontsize=10)
    return fig


def fig_rank_collapse(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    archs = list(result["architectures"])
    fig, axes = plt.subplots(len(archs), 3, figsize=(13, 3.75 * len(archs)), squeeze=False)
    for row, arch in enumerate(archs):
        kinds = result["architectures"][arch]
        for i, (name, data) in enumerate(kinds.items()):
            depth = range(len(data["residual"]))
            axes[row, 0].plot(depth, _floor(data["residual"]), marker=".", color=f"C{i}",
                              label=name)
            axes[row, 1].plot(depth, data["cosine"], marker=".", color=f"C{i}", label=name)
            axes[row, 2].plot(range(1, len(data["grad_q"]) + 1), _floor(data["grad_q"]),
                              marker=".", color=f"C{i}", label=name)
        _collapse_axes(axes[row], arch)
    fig.suptitle(f"Paper B: rank collapse at initialisation (width {result['width']}, "
                 f"{result['tokens']} tokens; median over {result['seeds']} seeds)", fontsize=10)
    fig.tight_layout()
    return fig


def fig_training(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    layers = result["layers"]
    fig, axes = plt.subplots(1, layers + 1, figsize=(3.6 * (layers + 1), 3.6), squeeze=False)
    for i, (name, h) in enumerate(result["kinds"].items()):
        axes[0, 0].plot(h["step"], h["loss"], color=f"C{i}", label=name)
        for layer in range(layers):
            axes[0, layer + 1].plot(h["step"], _floor([g[layer] for g in h["grad_q"]]),
                                    color=f"C{i}", label=name)
    axes[0, 0].set(xlabel="step", ylabel="training loss (nats / byte)")
    for layer in range(layers):
        axes[0, layer + 1].set(xlabel="step", yscale="log",
                               ylabel=f"‖∂loss/∂W_Q‖_F, layer {layer + 1}")
    for ax in axes[0]:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Paper B: gradient histories while training a small pre-norm decoder on the "
                 "text (not the checked model)", fontsize=10)
    fig.tight_layout()
    return fig


def _floor(values):
    return [max(v, 1e-300) for v in values]


def _collapse_axes(axes, arch: str) -> None:
    axes[0].set(yscale="log", xlabel="layer", ylabel=f"‖res(X)‖_F / ‖X‖_F ({arch})")
    axes[1].set(xlabel="layer", ylabel=f"mean pairwise cosine ({arch})", ylim=(-0.05, 1.05))
    axes[2].set(yscale="log", xlabel="layer", ylabel=f"‖∂loss/∂W_Q‖_F ({arch})")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)


def head_diagnostics(result: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    own = result["normalizers"][MODEL_SOFTMAX]
    heads = result["heads"]
    layers = [int(h[1:].split("H")[0]) for h in heads]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    sc = ax.scatter(own["entropy_normalized"], own["plateau"], c=layers, cmap="viridis", s=14)
    fig.colorbar(sc, ax=ax, label="layer")
    ax.set(xlabel="mean entropy / log(keys)  (1 = uniform, 0 = one-hot)",
           ylabel="N_s/N plateau (mean over N ≥ 16)", xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Per-head saturation diagnostic, L = {result['L']}\n{title}", fontsize=10)
    return fig


def normalizers_figure(ex: dict, title: str):
    import matplotlib.pyplot as plt  # optional dependency (plots extra)

    panels = [k for k in ("distance_vs_length", "separability", "gradient") if k in ex]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, name in zip(axes[0], panels):
        NORMALIZER_PANELS[name](ax, ex[name])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Normalizers applied to the model's own logits\n{title}", fontsize=10)
    fig.tight_layout()
    return fig


def _panel_distance(ax, result):
    for i, (nid, own) in enumerate(result["normalizers"].items()):
        med, _, _ = _quartiles(own["dtilde"])
        ax.plot(result["lengths"], med, marker="o", ms=3, color=f"C{i}", label=nid)
    ax.set(xscale="log", yscale="log", xlabel="L", ylabel=f"median d̃ (N = {result['N']})")


def _panel_separability(ax, result):
    for i, (nid, own) in enumerate(result["normalizers"].items()):
        med, _, _ = _quartiles(own["ratio"])
        ax.plot(result["N"], med, marker=".", color=f"C{i}", label=nid)
    ax.set(xscale="log", xlabel="N", ylabel="median N_s/N", ylim=(-0.05, 1.05))


def _panel_gradient(ax, result):
    for i, (nid, own) in enumerate(result["normalizers"].items()):
        g = [v if v and v > 0 and math.isfinite(v) else float("nan") for v in own["g"][0]]
        ax.plot(result["T"], g, marker=".", color=f"C{i}", label=nid)
    ax.set(xscale="log", yscale="log", xlabel="T", ylabel=f"g(T, ε={result['eps'][0]:g})")


DRAW = {
    "distance_vs_length": fig_distance_vs_length,
    "distance_vs_topn": fig_distance_vs_topn,
    "critical_topn": fig_critical,
    "separability": fig_separability,
    "gradient": fig_gradient,
    "lemma1": fig_lemma1,
    "temperature": fig_temperature,
    "coverage": fig_coverage,
    "convergence": fig_convergence,
    "rank_collapse": fig_rank_collapse,
    "training": fig_training,
}
NORMALIZER_PANELS = {
    "distance_vs_length": _panel_distance,
    "separability": _panel_separability,
    "gradient": _panel_gradient,
}
