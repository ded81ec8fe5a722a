"""hpzrec: runs real DeepSpeed on a CPU and writes the schedule it issues as hpzlab's IR.

Modules, one job each:
  stand_ins    every patch of torch / DeepSpeed the recording needs, in one place
  recording    the event log: streams, events, syncs, storages, byte ranges, labels
  accelerator  a DeepSpeed accelerator whose streams and events log what DeepSpeed does
  ops          a TorchDispatchMode that logs every aten op's reads and writes
  collectives  torch.distributed calls as NCCL would issue them (streams, handshakes)
  probes       wrappers around DeepSpeed's coordinator that label phase, module, purpose
  ir           the log -> hpzlab-schedule JSON (sim/ir/schedule_json.cpp reads it)
  model        the Hugging Face model and the training loop
  cli          `hpzlab record`'s arguments, errors and output
"""
