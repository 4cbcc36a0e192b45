"""Config sweeps: a sweep config and its points (`schema`), one point's run (`point_run`), launching the points
(`launch`), runs shared between sweeps (`adopt`), the stored results (`store`) and what is built from them
(`tables`, `significance`, `curves`, `study`), and compile-only plans (`plan`)."""
