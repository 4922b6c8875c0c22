"""bertlab: BERT pretraining, built step by step.

Importing bertlab never trains, downloads, prints or plots; it only defines things. Each name
below comes from the module of the lesson that teaches it (see the module docstrings).
"""

from bertlab.corpus import (
    CORPORA,
    Document,
    corpus_stats,
    iter_corpus,
    load_corpus,
    split_documents,
    split_of,
    split_sentences,
)
from bertlab.data import (
    NspDataset,
    PretrainingCollator,
    ShardDataset,
    prepare_shards,
    pretraining_loader,
)
from bertlab.finetune import (
    ClassificationResult,
    FinetuneConfig,
    compare_downstream,
    finetune_classifier,
    format_table,
    from_scratch,
    linear_probe,
    tfidf_baseline,
)
from bertlab.hf import load_hf, load_hf_tokenizer, save_hf
from bertlab.masking import (
    IGNORE_INDEX,
    Decision,
    example_seed,
    mask_tokens,
    mask_tokens_reference,
    word_ids_from_encoding,
)
from bertlab.model import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    count_parameters,
    flops_per_token,
    parameter_table,
)
from bertlab.nsp import IS_NEXT, NOT_NEXT, NspExample, create_nsp_examples, nsp_stats
from bertlab.tokenizer import (
    SPECIAL_TOKENS,
    SpecialIds,
    chinese_word_ids,
    encode_sentences,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    train_tokenizer,
    unk_rate,
)
from bertlab.train import (
    TrainConfig,
    TrainResult,
    evaluate,
    fill_mask,
    load_checkpoint,
    load_run,
    mlm_only_loss,
    pretrain,
    pretraining_loss,
    save_checkpoint,
    train_loop,
    unigram_baseline,
)

__version__ = "0.1.0"

__all__ = [
    "CORPORA", "Document", "corpus_stats", "iter_corpus", "load_corpus", "split_documents",
    "split_of", "split_sentences",
    "SPECIAL_TOKENS", "SpecialIds", "chinese_word_ids", "encode_sentences", "load_tokenizer",
    "save_tokenizer", "special_ids", "train_tokenizer", "unk_rate",
    "IGNORE_INDEX", "Decision", "example_seed", "mask_tokens", "mask_tokens_reference",
    "word_ids_from_encoding",
    "IS_NEXT", "NOT_NEXT", "NspExample", "create_nsp_examples", "nsp_stats",
    "NspDataset", "PretrainingCollator", "ShardDataset", "prepare_shards", "pretraining_loader",
    "BertConfig", "BertForPreTraining", "BertForSequenceClassification", "BertModel",
    "count_parameters", "flops_per_token", "parameter_table",
    "ClassificationResult", "FinetuneConfig", "compare_downstream", "finetune_classifier",
    "format_table", "from_scratch", "linear_probe", "tfidf_baseline",
    "load_hf", "load_hf_tokenizer", "save_hf",
    "TrainConfig", "TrainResult", "evaluate", "fill_mask", "load_checkpoint", "load_run",
    "mlm_only_loss", "pretrain", "pretraining_loss", "save_checkpoint", "train_loop",
    "unigram_baseline",
]
