// trainer/cuda_backend.hpp: the model on a GPU (cuda_backend.cu). Declared here so train.cpp, built
// by the host compiler, can ask for it; present only when the trainer is built with CUDA
// (FEEDLINE_TRAINER_CUDA). Every dense product is a cuBLAS GEMM, bf16 operands with fp32 accumulation
// on GPUs that have bf16 tensor cores (compute capability >= 8.0), fp32 otherwise; small kernels do
// the gather, tanh, softmax + cross-entropy, scatter and AdamW. Gradients are summed across ranks with
// NCCL when it is built in.
#pragma once

#include <memory>
#include <vector>

#include "communicator.hpp"
#include "model.hpp"

namespace trainer {

enum class gpu_precision { automatic, bf16, fp32 };

std::unique_ptr<backend> make_cuda_backend(const model_config& c, const optimizer_config& o, const std::vector<float>& initial, int device,
                                           gpu_precision precision, communicator* comm);

}  // namespace trainer
