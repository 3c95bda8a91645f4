// Host-side filling of one blob's fp32 values: from a checkpoint, or HF-style random init.
// Shared by every engine, so that the same seed gives the same weights in each.
#pragma once
#include <cstdint>

#include "model/layout.h"

namespace sf {

class CheckpointReader;

// host [blob.numel]: every entry read (and converted to fp32) from the checkpoint; padding 0.
void read_blob(const CheckpointReader& ckpt, const BlobLayout& blob, float* host);
// host [blob.numel]: normal(0, std) matrices and embeddings, blob.norm_init for norm weights, 0 for
// biases.
// `blob_index` is the blob's position in the model layout (part of the generator's seed).
void random_blob(const BlobLayout& blob, int blob_index, uint64_t seed, double std, float* host);

}  // namespace sf
