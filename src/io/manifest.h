// The manifest of an output or checkpoint directory: the size and CRC-32C of every file slideformer
// wrote into it, written last before the directory is published (StagedDir::commit) and verified
// when the directory is read again (a model to train or evaluate, a checkpoint to resume), so that
// a flipped bit in trainer_state.json, config.json or a tokenizer file is refused like one in a
// tensor. safetensors files are covered by size and the CRC-32C of their header (8-byte length +
// JSON); their tensors carry their own checksums (SafetensorsFile::verify_checksums), so their data
// is read once, not twice.
#pragma once
#include <string>
#include <vector>

namespace sf {

inline constexpr const char* kManifestName = ".sf-manifest.json";

// Lists every regular file of `dir` (not subdirectories, the output marker, marked temporaries or
// the manifest itself) in dir/.sf-manifest.json, atomically.
void write_manifest(const std::string& dir);

// False when `dir` has no manifest (another program's directory, or an older slideformer's).
// Else every listed file must exist with its size and checksum, and each of `required` must be
// listed; any defect -> InputError naming the file ("dir/trainer_state.json: CRC-32C 1a2b3c4d does
// not match the manifest's 5e6f7a8b ...").
bool verify_manifest(const std::string& dir, const std::vector<std::string>& required = {});

}  // namespace sf
