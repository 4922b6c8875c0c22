"""The engine: what makes a run real, one level below the lesson.

The lesson, at the top of `bertlab/`, says what BERT pretraining is. The engine is what a real
run needs besides: speed (the faster forward, devices, mixed precision, torch.compile, DDP),
faults (atomic files, folder locks, verified checkpoints, exact resume after a crash or Ctrl-C),
scale (corpora read and examples built in bounded memory, prepared shards on disk) and records
(run folders, history, TensorBoard events, model cards, a trained model loaded back).

An engine module imports any lesson module, and the engine modules listed before it. The lesson
reaches the engine only through the crossings that tests/test_project.py names in CROSSINGS,
each with its reason: the loop's hooks (`bertlab.engine.hooks.RunHooks`) by design, the others
edges still to be cut.

Its modules, in that order:

- files: atomic writes, what a folder holds, one process per folder.
- outputs: where a command may write, checked for every output path before any work.
- device: the device, mixed precision, torch.compile and DDP.
- textfiles: your own text files as Documents: a folder of .txt files or one BERT-format file.
- records: rows as Documents, streamed: JSON Lines, CSV, TSV, Parquet, and rows in Python.
- readers: `load_corpus` and `iter_corpus`: the named corpora and your own files.
- eventlog: a run's TensorBoard event files.
- checkpoint: checkpoints and trained models on disk, verified on every load.
- resume: stopping a run safely and resuming it exactly.
- hooks: what the training loop does around its step, one call each (`RunHooks`).
- fast: the training step's forward, faster, on the model's own weights.
- streaming: NSP examples from a stream of documents, in bounded memory.
- shards: prepared examples on disk, as memory-mappable .npy shards.
- loading: a trained model back from a run folder or a Hugging Face folder.
- sizes: parameter counts, training FLOPs per token, the presets' table.
- recipes: named pretraining recipes.
- card: the model card (README.md) of an exported model, `save_hf` (a Hugging Face folder,
  written in one step) and `export_run`.
- tasks: downstream tasks from disk (`load_task`, `compare_downstream`), and fine-tuning that
  starts from a saved run or export.
- run: the pretrain command's run, from its flags to `bertlab.pretraining.pretrain`.
"""
