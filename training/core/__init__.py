"""What the rest of training/ builds on: the optimizer and the pure train / eval steps (`step`), the compute dtype
(`precision`), the compilation cache (`compile_cache`), workdir files (`files`, `lock`, `metrics`), the CLIs'
errors, log levels and JAX platforms (`errors`, `logs`, `platforms`), and the one markdown table writer that sweeps/,
analysis/ and bench/ print with (`markdown`). Nothing here imports the packages above it."""
