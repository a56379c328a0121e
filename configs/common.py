"""The training fields every named config shares; each config file states its model and overrides.

Every field is declared here with a one-line comment, so a typo in a command-line override
(`--config.train.stpes=10`) is an error instead of a silently ignored key.
"""

import dataclasses

import ml_collections
from ml_collections.config_dict import placeholder

from transformer.model.config import AUTO, ModelConfig
from transformer.training.sharding import DEFAULT_RULES

# Execution settings a named config leaves to the backend (transformer/model/execution.py): float32 and the
# reference attention on a CPU, bfloat16 with cuDNN attention on a GPU, bfloat16 with XLA's on a TPU.
BACKEND_CHOSEN = {"dtype": AUTO, "attention_impl": AUTO}


def model_config(fields: dict) -> ml_collections.ConfigDict:
    """Every ModelConfig field: the given values, BACKEND_CHOSEN and ModelConfig's defaults for the rest.

    All fields are present so that any of them can be overridden on the command line; fields whose
    default is None (derived, e.g. num_kv_heads = num_heads) become typed placeholders.
    """
    unknown = set(fields) - {f.name for f in ModelConfig.fields()}
    if unknown:
        raise ValueError(f"unknown model field(s) {sorted(unknown)}; see transformer/model/config.py")
    model = ml_collections.ConfigDict()
    for f in ModelConfig.fields():
        value = fields.get(f.name, BACKEND_CHOSEN.get(f.name, f.default))
        if value is dataclasses.MISSING:
            raise ValueError(f"the model config needs {f.name}")
        model[f.name] = placeholder(int) if value is None else value
    return model


def base_config(model: dict) -> ml_collections.ConfigDict:
    """A full config around a `model` dict (fields of transformer.ModelConfig; the rest default)."""
    c = ml_collections.ConfigDict()
    c.model = model_config(model)

    c.data = ml_collections.ConfigDict()
    c.data.path = ""  # text file, folder or glob; "" = the bundled Shakespeare plays
    c.data.tokenizer = "bytes"  # 'bytes' (vocab 256, no training) or 'bpe' (trained on the corpus)
    c.data.vocab_size = c.model.get_ref("vocab_size")  # BPE vocabulary = the model's vocab_size
    c.data.val_fraction = 0.05  # the last 5% of the token stream is the validation set
    c.data.start_token = -1  # a token id that begins every window (a fixed start token, like a BOS); -1 = none
    c.data.cache_dir = ""  # memory-mapped token arrays, reused across runs; "" = .cache/tokens in the repository
    c.data.task = "text"  # 'text': windows of the corpus; 'needle': documents (needle.py); 'tables': tables.py; 'images': vit.py
    c.data.needle = ml_collections.ConfigDict()  # the needle documents (data.task='needle'), filler from the corpus
    c.data.needle.min_length = 64  # prompt length in tokens (bytes), drawn uniformly in [min_length, max_length]
    c.data.needle.max_length = 256  # train.seq_len must hold it and the answer
    c.data.needle.min_depth = 0.0  # where the needle sits in the haystack, drawn uniformly: 0 = first
    c.data.needle.max_depth = 1.0  # 1 = right before the question
    c.data.needle.digits = 5  # the value: this many random digits
    c.data.needle.graded = "answer"  # which targets the loss grades: 'answer' (the value's digits) or 'all'
    c.data.needle.facts = 1  # facts per document (distinct keys), one of them asked: > 1 is associative recall
    c.data.needle.question = "question"  # how it asks: 'question' in words, 'cloze' the needle's words up to the value
    c.data.needle.questions = 1  # questions per training row, each on a fact drawn at random (validation rows ask one)
    c.data.tables = ml_collections.ConfigDict()  # the synthetic tables (data.task='tables', tables.py); no corpus
    c.data.tables.max_features = 32  # tables have 1..max_features features (= model.num_features), zero-padded
    c.data.tables.max_classes = 4  # tables have 2..max_classes classes (<= model.num_classes)
    c.data.tables.min_train_rows = 8  # labelled rows of a table of train.seq_len rows: at least this many
    c.data.tables.min_test_rows = 8  # and at least this many rows to classify (the loss grades only those)
    c.data.tables.mlp_share = 0.5  # share of tables from a random MLP; the rest are Gaussian mixtures
    c.data.tables.min_separation = 0.5  # Gaussian mixtures: spread of the class centres, drawn in [min, max]
    c.data.tables.max_separation = 3.0
    c.data.images = ml_collections.ConfigDict()  # the pictures of data.task='images' (transformer/data/images.py)
    c.data.images.name = "shapes"  # 'shapes' (procedural, 32 x 32 x 3, 3 classes) or 'digits' (8 x 8 x 1, 10)

    c.optim = ml_collections.ConfigDict()
    c.optim.name = "adamw"  # 'adamw', or 'muon': Muon on the layers' matrices, AdamW on the rest (optim.py)
    c.optim.learning_rate = 1e-3  # peak learning rate after warm-up (AdamW's; with Muon, of the non-matrices)
    c.optim.schedule = "cosine"  # 'cosine' decay, or 'wsd': warm-up, stable at the peak, linear decay at the end
    c.optim.warmup_steps = 100  # linear warm-up from 0
    c.optim.decay_steps = 0  # the schedule ends (decayed) after this many steps, then constant; 0 = train.steps
    c.optim.decay_fraction = 0.3  # 'wsd': the linear decay takes this last fraction of decay_steps
    c.optim.min_lr_ratio = 0.1  # the decay ends at this fraction of the peak
    c.optim.muon_learning_rate = 0.02  # Muon's peak rate (same schedule shape), for updates scaled sqrt(max(1, out/in))
    c.optim.muon_momentum = 0.95  # Muon's Nesterov momentum
    c.optim.muon_weight_decay = 0.0  # decoupled weight decay on Muon's matrices (x the Muon rate, like AdamW's)
    c.optim.b1 = 0.9  # AdamW first-moment decay
    c.optim.b2 = 0.99  # AdamW second-moment decay
    c.optim.eps = 1e-8  # AdamW epsilon
    c.optim.weight_decay = 0.1  # decoupled weight decay on matrices
    c.optim.decay_embeddings = False  # also decay embedding tables (norms and biases never are)
    c.optim.grad_clip = 1.0  # global-norm clipping threshold (0 = off)

    c.train = ml_collections.ConfigDict()
    c.train.steps = 2000  # optimizer steps (the learning-rate schedule spans them)
    c.train.run_steps = 0  # stop (with a checkpoint) after this many steps of this invocation; 0 = all
    c.train.batch_size = 32  # sequences per optimizer step (global, over all devices)
    c.train.seq_len = 128  # tokens per sequence (<= model.max_seq_len)
    c.train.grad_accum = 1  # micro-batches per step (batch_size must divide by it)
    c.train.seed = 0  # parameters, data order and dropout all derive from it
    c.train.log_every = 50  # steps between metric lines in metrics.jsonl / TensorBoard
    c.train.eval_every = 250  # steps between validation evaluations
    c.train.eval_batches = 8  # fixed validation batches per evaluation
    c.train.eval_attention_shares = False  # also log the first-token (and register, sink) attention share at each eval
    c.train.eval_induction = False  # also log each head's induction score and the repeated-tokens loss at each eval
    c.train.checkpoint_every = 250  # steps between checkpoints
    c.train.keep_checkpoints = 3  # most recent checkpoints kept (plus the best by validation loss)
    c.train.sample_tokens = 200  # length of the sample printed at the end (0 = none)
    c.train.peak_flops = 2e11  # FLOP/s of the hardware, for model FLOP utilisation in the log

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # data-parallel axis size; -1 = all devices not used by fsdp and tensor
    c.mesh.fsdp = 1  # shard parameters and optimizer state over this many devices
    c.mesh.tensor = 1  # tensor parallelism: split heads, MLP width and vocabulary over this many devices
    c.mesh.expert = 1  # expert parallelism: split a mixture's experts (model.num_experts) over this many devices
    # Logical axis -> mesh axes ("data,fsdp"; "" = replicated); see transformer/training/sharding.py and the README.
    c.mesh.rules = ml_collections.ConfigDict(DEFAULT_RULES)

    c.init_from_hf = ""  # a local Hugging Face model directory to start from ("" = random init)
    return c
