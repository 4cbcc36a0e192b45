"""Reading a trained run back: loading it (`loaded`), dev loss and BLEU (`dev`), scoring and translation
(`evaluate`, `translate`), reports."""
