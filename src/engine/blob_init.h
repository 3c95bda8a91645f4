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
// The same, elements [w0, w1) of the blob only, into dst [w1 - w0] (the same bytes as those of the
// whole blob's): the engines fill large blobs a window at a time, so that set-up holds a window
// beside the engine's memory, not the largest blob (a 123B layer: 5.6 GB of fp32).
void read_blob_window(const CheckpointReader& ckpt, const BlobLayout& blob, int64_t w0, int64_t w1, float* dst);
void random_blob_window(const BlobLayout& blob, int blob_index, uint64_t seed, double std, int64_t w0, int64_t w1,
                        float* dst);
// The window the engines fill at a time (elements: 256 MiB of fp32).
constexpr int64_t kBlobFillWindow = int64_t(1) << 26;

}  // namespace sf
