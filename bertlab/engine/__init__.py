"""The engine: what makes a run real, one tier below the loop and above the foundations.

The foundations (`bertlab.masking`, `bertlab.model`, `bertlab.data`...) say what BERT is; the
loop (`bertlab.train`, `bertlab.pretraining`, `bertlab.finetune`...) runs it. The engine is what
a real run needs besides: faults (folders written whole, one writer per folder, verified
checkpoints, exact resume after a crash or Ctrl-C), speed (devices, mixed precision,
torch.compile, DDP), scale (examples built in bounded memory, prepared shards on disk) and
records (the run session's history and logs, TensorBoard event files).

An engine module imports the foundations and other engine modules, never the loop, the course
or the commands: the loop calls the engine, and hands it what it needs
(`tests/test_project.py::test_every_import_points_down`; bertlab/README.md draws the tiers).

Its modules:

- folders: folders built whole and renamed into place, a killed writer's leftovers swept, one
  process per folder (`FolderLock`).
- outputs: where a command may write, checked for every output path before any work.
- device: the device, mixed precision, torch.compile and DDP.
- eventlog: a run's TensorBoard event files.
- checkpoint: checkpoints on disk, verified on every load.
- resume: stopping a run safely and resuming it exactly.
- session: the run around the loop's step, one call each (`RunHooks`): the device, the output
  guard, resume, the data's record, evaluation, logs and checkpoints.
- streaming: examples (NSP, SOP or single segments) from a stream of documents, in bounded
  memory (`StreamingExampleBuilder`).
- shards: prepared examples on disk, as memory-mappable .npy shards.
"""
