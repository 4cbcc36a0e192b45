"""One training run: the loop that orchestrates it (`loop`), on top of the rest of training/."""
