"""Special token ids, fixed so that the model, the batches and the vocabulary agree on them."""

PAD_ID = 0  # padding: masked as a key, ignored by the loss, fills a finished decode
EOS_ID = 1  # end of sequence: decoding stops at it
BOS_ID = 2  # first decoder input token
UNK_ID = 3  # a piece the vocabulary lacks (SentencePiece's unk)
