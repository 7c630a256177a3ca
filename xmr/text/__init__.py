"""Text side: vocabulary, word vectors (GloVe/word2vec), BERT-family encoders, HGLMM Fisher vectors."""
