// Random training records for engine tests: 3-11 token ids each, labels = ids, every third
// record with one ignored label.
#pragma once
#include <random>
#include <vector>

#include "data/dataset/dataset.h"

namespace sf::test {

inline std::vector<Record> random_records(int vocab, uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<Record> recs;
  for (int i = 0; i < n; ++i) {
    Record r;
    const int len = 3 + int(rng() % 9);
    for (int t = 0; t < len; ++t) r.ids.push_back(int32_t(rng() % uint64_t(vocab)));
    r.labels = r.ids;
    if (i % 3 == 1) r.labels[1] = kIgnoreIndex;
    recs.push_back(r);
  }
  return recs;
}

}  // namespace sf::test
