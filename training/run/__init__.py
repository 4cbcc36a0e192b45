"""One training run: the loop that orchestrates it (`loop`), the pure step (`step`), checkpoints and metrics."""
