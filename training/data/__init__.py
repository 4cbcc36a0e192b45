"""Data: parallel corpora (`corpus`), the SentencePiece vocabulary (`tokenizer`), token-budget batches (`batching`)."""
