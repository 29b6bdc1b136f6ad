"""The model check, ``attnverify empirical``: paper A's experiments and paper B's rank-collapse
check on any Hugging Face causal LM.

Layout (one module per role):

- :mod:`.models` — loading (GPT-2 random, SmolLM2 GGUF, local dirs, hub cache); no pickles.
- :mod:`.text` — the text and its token windows.
- :mod:`.extraction` — one forward pass per window; q, k, v of every head.
- :mod:`.rows` — which query rows ("tokens") each length uses; batches across heads.
- :mod:`.distance`, :mod:`.separation`, :mod:`.gradient`, :mod:`.collapse` — the metrics of
  Theorem 1, Theorem 2, Algorithm 5 and paper B, batched over heads and all N at once.
- :mod:`.experiments` — the six experiments; :mod:`.comparison` — the paper-comparison table.
- :mod:`.pipeline` — checkpoints, ``--resume``, outputs; :mod:`.figures`, :mod:`.report`.
- :mod:`.cli` — ``add_parser(subparsers)`` and ``run(args)`` for the main CLI.
"""
