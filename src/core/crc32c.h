// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI/ext4/leveldb use it: the
// per-tensor checksum of the safetensors files slideformer writes. The SSE4.2 instruction where the
// CPU has it, else slice-by-8 tables (~2 GB/s).
#pragma once
#include <cstddef>
#include <cstdint>

namespace sf {

// Continues `crc` (0 for a new message) over `bytes` bytes: crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// The table version, on every CPU (crc32c uses it where SSE4.2 is missing; tests compare the two).
uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace sf
