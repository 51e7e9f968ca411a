"""The data wing: text sources and tokenizers, the token cache (each split tokenised once into a
memmap), and which windows each training or evaluation batch holds.
"""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'corpus': (
            *('Corpus', 'cache_dir', 'check_same_tokenizer', 'load_corpus', 'load_tokenizer'),
            'tokenizer_identity',
        ),
        'files': ('stdlib_files',),
        'tokenizer': ('Tokenizer', 'train_bpe'),
        'windows': ('call_batch', 'eval_batches', 'eval_windows', 'train_batch'),
        'recall': ('TASKS', 'nth_answer_only'),
        'parts': ('FOUR', 'block_parts', 'cuts', 'part_shares'),
    },
)
