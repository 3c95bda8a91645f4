// AdamW on the device (PyTorch semantics; ops.h). param/m/v F32, grad F32 or BF16,
// param_copy (optional) F32 or BF16, all of the same numel.
#pragma once
#include "backend/cuda/launch.h"
#include "backend/ops.h"

namespace sf::cuda {

void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& p, const Launch& L);

}  // namespace sf::cuda
