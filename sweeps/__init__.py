"""Config sweeps: running their points (`sweep`) and the tables and plots built from them (`tables`)."""
