"""Training recipe for Solo's bundled default model.

Solo ships a small Llama-architecture code model trained from scratch on the Python sources of
the CPython standard library, so that ``solo run`` works offline without downloading weights.
The recipe is reproducible and seeded; run ``python -m solo.train --help`` for its options and
``scripts/train_default_model.sh`` for the exact command used for the shipped model.
"""
