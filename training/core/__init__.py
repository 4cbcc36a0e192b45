"""What the rest of training/ builds on: the optimizer and the pure train / eval steps (`step`), the compute dtype
(`precision`), the compilation cache (`compile_cache`), workdir files (`files`, `lock`, `metrics`), and the CLIs'
errors, log levels and JAX platforms (`errors`, `logs`, `platforms`). Nothing here imports the packages above it."""
