// Activation checkpointing (Chen et al. 2016, "Training Deep Nets
// with Sublinear Memory Cost"). LibTorch's C++ API has no
// torch.utils.checkpoint, so this is the same idea as a custom autograd
// function: a segment of the network runs forward without recording a graph
// and autograd keeps only its input; backward runs the segment forward once
// more, with the graph recorded, and backpropagates through that.
//
// Cost: one extra forward of every checkpointed segment per step. Memory:
// a segment holds its input tensor from forward to backward instead of all
// its intermediate activations; during backward the activations of one
// segment exist at a time.
#ifndef LOOM_WORKER_ENGINE_ACTIVATION_CHECKPOINT_H_
#define LOOM_WORKER_ENGINE_ACTIVATION_CHECKPOINT_H_

#include <functional>
#include <vector>

#include <torch/types.h>

namespace loom::engine {

// A pure function of `input` and the parameters handed to
// CheckpointedForward alongside it (it may read no other tensor that needs
// a gradient: gradients reach only `input` and those parameters).
using SegmentFunction = std::function<torch::Tensor(const torch::Tensor& input)>;

// segment(input), with autograd saving only `input`. The value equals
// segment(input). Backward reruns segment(input) with grad mode on, under the
// autocast state (CPU and CUDA) that was current at the first run and with
// LibTorch's default CPU generator set to the state it had then (so dropout
// draws the same masks; the generator is put back afterwards), and returns
// the gradients of that rerun with respect to input and `parameters`.
// Gradients of the parameters flow through the graph as usual (they
// accumulate into .grad through their AccumulateGrad nodes, and
// torch::autograd::grad works through a checkpoint).
//
// Only the CPU generator is replayed: a segment that draws random numbers on
// a CUDA device would draw different ones in the rerun (not detected), so do
// not checkpoint CUDA segments with dropout > 0.
//
// When grad mode is off, or neither input nor any parameter requires a
// gradient, this is just segment(input).
//
// `segment` must stay callable until backward has run (it is kept with the
// graph). Thread-compatible: backward runs on the thread that calls
// backward(), like any autograd function.
torch::Tensor CheckpointedForward(SegmentFunction segment, const torch::Tensor& input,
                                  const std::vector<torch::Tensor>& parameters);

// Blocks per checkpointed segment for GptConfig::activation_checkpointing
// `setting` over `n_layer` blocks: 0 = no checkpointing; k >= 1 = min(k,
// n_layer); kActivationCheckpointingSqrt (-1) = ceil(sqrt(n_layer)) (Chen et
// al. sec. 4.1). Segments start at blocks 0, k, 2k, ...; the last may be
// shorter.
int CheckpointSegmentBlocks(int n_layer, int setting);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ACTIVATION_CHECKPOINT_H_
