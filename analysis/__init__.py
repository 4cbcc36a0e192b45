"""Looking inside the heads of a trained workdir: attention maps, head roles, importance, pruning, GQA uptraining.

Each module does one job on the model `training.evaluation.loaded.load_run` loads; `analyze.py` is the CLI.
Head-indexed results are dicts keyed by `models.HEAD_MASK_KEYS` ("encoder_self", "decoder_self",
"decoder_cross") holding `[num_layers, num_heads]` arrays.
"""
