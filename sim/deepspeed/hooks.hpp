// The hook program of one micro-step: which of DeepSpeed's module hooks and which kernels fire,
// in order, as transformers' forward and autograd's backward (recompute included) walk the
// module tree (model_tree.hpp).
//
// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.
#pragma once

#include <vector>

#include "sim/deepspeed/model_tree.hpp"

namespace hpz::deepspeed {

/** What fires: one of DeepSpeed's module hooks, a kernel, or a host wait. */
enum class Ev {
  kPreFwd,   // forward pre-hook: fetch_sub_module (PO:441-452)
  kPostFwd,  // forward hook: release_sub_module
  kPreBwd,   // PreBackwardFunction on the module's outputs (PO:328-360)
  kPostBwd,  // PostBackwardFunction on its inputs (PO:380-410)
  kFwdKernel,
  kBwdKernel,  // the module's backward kernel, then its parameter's gradient hook
  kLoss,
  kHostSync,  // the model's own wait for the compute stream (a data-dependent size)
  // A z3 leaf's full backward hook: the gradients of every parameter below it reduced, in
  // model.parameters() order (S3:1261-1274 at v0.18.2, PR 7592).
  kLeafGradHook,
};

/** One step of the hook program: what fires, on which module, in a recompute or not, with grad
 *  enabled or not. */
struct Hook {
  Ev ev;
  int module;
  bool recompute = false;
  bool grad_enabled = true;
};

/** How the model's forward and backward run, beyond its module tree. */
struct Walk {
  bool checkpointing = false;  ///< training.grad_checkpointing
  /// transformers 5: torch.utils.checkpoint with use_reentrant=False (modeling_utils.py:3157-3158
  /// at 5.24.0, when gradient_checkpointing_enable gets no kwargs) of the decoder layer's
  /// `forward`, so the layer's own hooks stay outside the checkpoint (modeling_layers.py:85-126).
  bool non_reentrant = false;
  /// transformers 5 with checkpointing: one data-dependent check after the embedding for each
  /// attention mask the model makes (micro_step_hooks).
  int mask_host_waits = 0;
};

/** The hooks and kernels of one micro-step (forward, loss, backward), in the order they fire. */
std::vector<Hook> micro_step_hooks(const Model& md, const Walk& walk);

}  // namespace hpz::deepspeed
